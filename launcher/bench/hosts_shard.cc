#include "launcher/bench/hosts_shard.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "comm/huge_pages.h"
#include "comm/store/prefix_store.h"
#include "launcher/cli_util.h"
#include "sync/model/model.h"
#include "sync/model/tensor_parallel_plan.h"
#include "sync/trainer/shard_classes.h"

namespace weightcast::launcher {

std::unique_ptr<comm::GlooCommunicator> hosts_communicator(const HostsWorkerOptions& o,
                                                           std::shared_ptr<comm::Store> store,
                                                           int rank, int size) {
  comm::CommOptions opts =
      comm::member_options(std::move(store), rank, size, comm::Millis(o.timeout_ms));
  opts.gloo.bind_address = o.bind_address;
  opts.gloo.chain.chunk_bytes = o.chunk_bytes;
  opts.gloo.chain.chunks_in_flight = o.chunks_in_flight;
  opts.gloo.single_copy.enabled = o.single_copy;
  return comm::create_gloo_communicator(opts);
}

namespace {

using sync::trainer::NamedTensor;
using sync::trainer::ShardClass;
using sync::trainer::SliceSource;

// The model every worker makes alike: the full tensors of a model of about o.bytes, step 0.
struct FullModel {
  sync::ModelSpec spec;
  std::vector<sync::TensorMeta> metas;
  std::vector<std::byte, comm::HugePageAllocator<std::byte>> arena;
  std::vector<NamedTensor> tensors;

  explicit FullModel(std::uint64_t bytes)
      : spec(sync::model_spec_for_bytes(bytes)), metas(sync::hf_tensors(spec)) {
    arena.resize(sync::total_bytes(metas));
    std::size_t at = 0;
    for (const auto& m : metas) {
      const std::span<std::byte> out(arena.data() + at, m.byte_count());
      sync::fill_tensor(m, 1, 0, out);
      tensors.push_back(NamedTensor{m, out});
      at += m.byte_count();
    }
  }
};

// Broadcasts `tensors` from group rank 0 of `c` in buckets of about `bucket` bytes (a larger
// tensor goes alone), every rank splitting them alike. The root writes each tensor into its
// bucket (write_tensor(): a slice straight from its full tensor, as the trainer's packer does);
// a receiver receives into its bucket and, with `check`, counts the bytes that differ from
// `expected` (its own slices, back to back).
struct Pass {
  unsigned long long wrong = 0;
  unsigned long long received = 0;  // bytes a receiver got
};

Pass run_buckets(comm::Communicator& c, std::span<const NamedTensor> tensors, std::size_t bucket,
                 std::vector<std::byte>& buf, std::span<const std::byte> expected, bool check) {
  const bool root = c.rank() == 0;
  Pass pass;
  std::size_t first = 0, sent = 0;
  while (first < tensors.size()) {
    std::size_t end = first, size = 0;
    while (end < tensors.size() && (size == 0 || size + tensors[end].meta.byte_count() <= bucket)) {
      size += tensors[end++].meta.byte_count();
    }
    if (buf.size() < size) buf.resize(size);
    if (root) {
      std::size_t at = 0;
      for (std::size_t i = first; i < end; ++i) {
        const std::size_t n = tensor_size(tensors[i]);
        sync::trainer::write_tensor(tensors[i], {buf.data() + at, n});
        at += n;
      }
    }
    c.broadcast(comm::BroadcastOptions{buf.data(), size, 0, comm::MemoryKind::kHost, {}, {}});
    if (!root) pass.received += size;
    if (!root && check) {
      for (std::size_t b = 0; b < size; ++b) pass.wrong += buf[b] != expected[sent + b];
    }
    sent += size;
    first = end;
  }
  return pass;
}

// Rank 0 sums every rank's value of `key` (posted here) and returns the total and the maximum.
std::pair<unsigned long long, unsigned long long> gather_sum_max(const HostsWorkerOptions& o,
                                                                 comm::Store& store,
                                                                 const std::string& key,
                                                                 unsigned long long mine) {
  store.set(key + "/" + std::to_string(o.rank), std::to_string(mine), comm::Millis(o.timeout_ms));
  unsigned long long sum = 0, most = 0;
  if (o.rank == 0) {
    for (int r = 1; r < o.size; ++r) {
      const auto v =
          std::stoull(store.get(key + "/" + std::to_string(r), comm::Millis(o.timeout_ms)));
      sum += v;
      most = std::max(most, v);
    }
  }
  return {sum, most};
}

// The world ranks of class `cls` for engines of `tp` ranks: the source, then each member's.
std::vector<int> class_world_ranks(const ShardClass& cls, int tp) {
  std::vector<int> out = {0};
  for (const auto& m : cls.members) {
    for (int r : m.ranks) out.push_back(1 + static_cast<int>(m.engine) * tp + r);
  }
  return out;
}

struct Timed {
  double us = 0;
  Pass pass;  // the last timed pass's bytes, the warm-up's #wrong
};

// `once(check)` is this rank's part of one broadcast: a checked warm-up, then o.iters timed
// ones between world barriers (the slowest receiver ends the measurement).
template <typename Once>
Timed time_passes(const HostsWorkerOptions& o, comm::Communicator& world, Once once) {
  Timed t;
  const unsigned long long wrong = once(true).wrong;
  world.barrier(comm::Millis(o.timeout_ms));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) t.pass = once(false);
  t.pass.wrong = wrong;
  world.barrier(comm::Millis(o.timeout_ms));
  t.us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         o.iters;
  return t;
}

// One TP size: the classes, a communicator and a SliceSource per class this rank is in, and
// the timed passes (the source's classes each on its own thread).
void time_tp(const HostsWorkerOptions& o, comm::GlooCommunicator& world,
             const std::shared_ptr<comm::Store>& store, const FullModel& model, int tp) {
  const int engine_ranks = o.size - 1;
  if (tp < 1 || engine_ranks % tp != 0) {
    throw comm::ConfigError("--shard-tps: " + std::to_string(tp) + " does not divide the " +
                            std::to_string(engine_ranks) + " receiving hosts");
  }
  const int engines = engine_ranks / tp;
  std::vector<std::vector<sync::ShardPlan>> plans(engines);
  std::vector<int> counts(engines, tp);
  std::vector<std::size_t> members(engines);
  for (int e = 0; e < engines; ++e) {
    members[e] = e;
    for (int k = 0; k < tp; ++k) {
      plans[e].push_back(sync::tensor_parallel_plan(model.spec, model.metas, {tp, k, 1, {}}));
    }
  }
  const std::vector<ShardClass> classes = sync::trainer::shard_classes(members, plans, counts);

  struct Mine {
    std::unique_ptr<comm::GlooCommunicator> comm;
    std::unique_ptr<SliceSource> src;
    std::span<const NamedTensor> tensors;
    std::vector<std::byte> buf;
    std::vector<std::byte> expected;  // a receiver's slices, back to back
  };
  std::vector<Mine> mine;  // the source: every class; a receiver: its own
  for (std::size_t i = 0; i < classes.size(); ++i) {
    const std::vector<int> ranks = class_world_ranks(classes[i], tp);
    const auto at = std::find(ranks.begin(), ranks.end(), o.rank);
    if (at == ranks.end()) continue;
    Mine m;
    m.src = std::make_unique<SliceSource>();
    m.tensors = m.src->reset(classes[i], model.tensors, {}, false);
    const auto prefix = "tp" + std::to_string(tp) + "/c" + std::to_string(i);
    m.comm =
        hosts_communicator(o, std::make_shared<comm::PrefixStore>(prefix, store),
                           static_cast<int>(at - ranks.begin()), static_cast<int>(ranks.size()));
    if (o.rank != 0) {  // a receiver's expected slices: packed now, outside the timing
      m.expected.resize(m.src->bytes());
      std::size_t written = 0;
      for (const auto& t : m.tensors) {
        sync::trainer::write_tensor(t, {m.expected.data() + written, tensor_size(t)});
        written += tensor_size(t);
      }
    }
    mine.push_back(std::move(m));
  }
  const std::size_t bucket = o.bucket_bytes;
  auto once = [&](bool check) {
    if (o.rank != 0) {
      Mine& m = mine.at(0);
      return run_buckets(*m.comm, m.tensors, bucket, m.buf, m.expected, check);
    }
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      threads.emplace_back([&, i] {
        try {
          run_buckets(*mine[i].comm, mine[i].tensors, bucket, mine[i].buf, {}, false);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    return Pass{};
  };
  const Timed t = time_passes(o, world, once);
  const std::string key = "shard/tp" + std::to_string(tp);
  const auto wrong = gather_sum_max(o, *store, key + "/wrong", t.pass.wrong).first;
  const auto received = gather_sum_max(o, *store, key + "/bytes", t.pass.received).second;
  if (o.rank != 0) return;
  // What a rank should receive: the most any rank's plan keeps, and the sharded bytes over tp
  // plus the replicated ones (more than that where ranks share a KV head).
  std::size_t planned = 0, sharded = 0, replicated = 0;
  for (const auto& plan : plans.at(0)) {
    std::size_t keeps = 0;
    for (const auto& m : model.metas) keeps += sync::sliced_bytes(m, *plan.find(m.name));
    planned = std::max(planned, keeps);
  }
  for (const auto& m : model.metas) {
    const bool sliced = plans.at(0).at(0).find(m.name)->kind == sync::TensorSlice::Kind::kSlice;
    (sliced ? sharded : replicated) += m.byte_count();
  }
  std::printf("shard %d %.1f %llu %llu %zu %zu %zu\n", tp, t.us, wrong, received, planned,
              sharded / tp + replicated, classes.size());
  std::fflush(stdout);
}

}  // namespace

void time_sharded(const HostsWorkerOptions& o, comm::GlooCommunicator& world,
                  std::shared_ptr<comm::Store> store) {
  const FullModel model(o.bytes);
  // The full broadcast: every tensor whole, every rank, one chain (the world group).
  std::vector<std::byte> buf;
  const Timed full = time_passes(o, world, [&](bool check) {
    return run_buckets(world, model.tensors, o.bucket_bytes, buf, model.arena, check);
  });
  const auto wrong = gather_sum_max(o, *store, "shard/full/wrong", full.pass.wrong).first;
  const auto received = gather_sum_max(o, *store, "shard/full/bytes", full.pass.received).second;
  if (o.rank == 0) {
    std::printf("shard full %.1f %llu %llu\n", full.us, wrong, received);
    std::fflush(stdout);
  }
  for (int tp : o.shard_tps) time_tp(o, world, store, model, tp);
}

void add_sharded_rows(const HostsBenchOptions& o, ChildProcess& root, BenchTable& table,
                      double link) {
  const std::chrono::milliseconds timeout(o.timeout_ms);
  double full_us = 0;
  unsigned long long wrong = 0, model = 0;
  std::string l = root.line_starting("shard full ", timeout, "hosts sharded broadcast");
  if (std::sscanf(l.c_str(), "shard full %lf %llu %llu", &full_us, &wrong, &model) != 3) {
    throw std::runtime_error("hosts root said: " + l);
  }
  const double m = static_cast<double>(model);
  table.add({std::string("full broadcast"), static_cast<std::uint64_t>(model), full_us,
             m / full_us * 1e-3, m / (full_us * 1e-6) / link},
            static_cast<std::uint64_t>(wrong));
  for (int tp : o.shard_tps) {
    int got_tp = 0;
    double us = 0;
    unsigned long long received = 0, planned = 0, expected = 0, classes = 0;
    l = root.line_starting("shard ", timeout, "hosts sharded broadcast");
    if (std::sscanf(l.c_str(), "shard %d %lf %llu %llu %llu %llu %llu", &got_tp, &us, &wrong,
                    &received, &planned, &expected, &classes) != 7 ||
        got_tp != tp) {
      throw std::runtime_error("hosts root said: " + l);
    }
    table.add({"sharded TP-" + std::to_string(tp), static_cast<std::uint64_t>(model), us,
               m / us * 1e-3, m / (us * 1e-6) / link},
              static_cast<std::uint64_t>(wrong));
    char buf[400];
    std::snprintf(buf, sizeof(buf),
                  "TP-%d (engines: %d, classes: %llu): sharded %.2fx faster than the full "
                  "broadcast; a rank received at most %llu B = %.3f of the model (its plan: "
                  "%llu B; sharded/TP + replicated: %llu B)",
                  tp, o.receivers / tp, classes, full_us / us, received,
                  static_cast<double>(received) / m, planned, expected);
    table.note(buf);
  }
}

}  // namespace weightcast::launcher
