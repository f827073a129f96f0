#include "launcher/bench_update.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "launcher/bench_hosts.h"
#include "launcher/child_process.h"
#include "launcher/cli_util.h"
#include "launcher/process_stats.h"
#include "sync/model/checksum.h"
#include "sync/model/drift.h"
#include "sync/model/model.h"
#include "sync/trainer/engine_client.h"
#include "sync/trainer/tensor_arena.h"
#include "sync/trainer/updater.h"

namespace weightcast::launcher {
namespace {

using std::chrono::milliseconds;

// The raw data plane: one gloo-chain broadcast of `bytes` from a source to `receivers` processes
// (bench hosts-worker on loopback), seconds per broadcast.
double raw_chain_seconds(const UpdateBenchOptions& o, const std::string& self, std::uint64_t bytes,
                         int receivers) {
  auto args = [&](int rank, int port) {
    HostsWorkerOptions w;
    w.rank = rank;
    w.size = receivers + 1;
    w.bind_address = "127.0.0.1";
    w.store_host = "127.0.0.1";
    w.store_port = port;
    w.bytes = bytes;
    w.iters = o.iters;
    w.chunk_bytes = o.chunk_bytes;
    w.timeout_ms = o.timeout_ms;
    w.backends = {"gloo-chain"};
    w.single_copy = o.single_copy;
    return hosts_worker_argv(self, w);
  };
  const milliseconds timeout(o.timeout_ms);
  ChildProcess root(args(0, 0));
  int port = 0;
  std::sscanf(root.line(timeout, "raw broadcast root").c_str(), "store-port %d", &port);
  std::vector<std::unique_ptr<ChildProcess>> others;
  for (int r = 1; r <= receivers; ++r)
    others.push_back(std::make_unique<ChildProcess>(args(r, port)));
  char name[64];
  double us = 0;
  unsigned long long wrong = 0;
  if (std::sscanf(root.line_starting("result ", timeout, "raw broadcast").c_str(),
                  "result %63s %lf %llu", name, &us, &wrong) != 3 ||
      wrong != 0) {
    throw std::runtime_error("raw broadcast failed or delivered wrong bytes");
  }
  // Every worker ends with a barrier: let them finish it rather than stop them inside it.
  root.wait_exit(timeout);
  for (auto& other : others) other->wait_exit(timeout);
  return us * 1e-6;
}

// Engines on loopback, each reporting its URL.
struct LocalEngines {
  std::vector<std::unique_ptr<ChildProcess>> processes;
  std::vector<std::string> urls;
};

LocalEngines start_engines(const UpdateBenchOptions& o, const std::string& self,
                           const std::string& spec_path, std::uint64_t model_bytes) {
  LocalEngines out;
  for (int e = 0; e < o.engines; ++e) {
    out.processes.push_back(std::make_unique<ChildProcess>(
        update_engine_argv(o, self, spec_path, model_bytes, "127.0.0.1"), engine_child()));
    out.urls.push_back(engine_url(*out.processes.back(), milliseconds(o.timeout_ms)));
  }
  return out;
}

// Tensors of the target runner whose digest on the engine differs from the digest of what was
// sent (or that the engine lacks), summed over engines. Not timed.
std::uint64_t wrong_tensors(const std::vector<std::string>& urls,
                            const std::vector<sync::TensorMeta>& metas,
                            const sync::trainer::TensorArena& storage, milliseconds timeout) {
  std::map<std::string, std::string> sent;
  for (std::size_t i = 0; i < metas.size(); ++i) {
    sent[metas[i].name] = sync::to_string(sync::tensor_digest(storage[i]));
  }
  sync::trainer::EngineClientOptions co;
  co.request_timeout = timeout;
  std::uint64_t wrong = 0;
  for (const auto& url : urls) {
    sync::trainer::EngineClient client(url, co);
    std::map<std::string, std::string> held;
    for (const auto& t : client.weights_checksum(sync::Runner::kTarget).tensors) {
      held[t.name] = t.digest;
    }
    for (const auto& [name, digest] : sent)
      wrong += held.count(name) && held[name] == digest ? 0 : 1;
  }
  return wrong;
}

sync::trainer::UpdaterOptions updater_options(const UpdateBenchOptions& o) {
  sync::trainer::UpdaterOptions uo;
  uo.selector = sync::Selector::kTarget;
  uo.bind_address = o.bind_address;
  uo.buckets.bucket_bytes = o.bucket_bytes;
  uo.buckets.max_in_flight = static_cast<std::size_t>(o.max_in_flight);
  uo.buckets.timeout = milliseconds(o.timeout_ms);
  uo.request_timeout = milliseconds(o.timeout_ms);
  uo.group_timeout = milliseconds(o.timeout_ms);
  // The source's chain chunks must match the engines' --chunk-bytes (checked at group setup).
  uo.communicator_factory = [chunk = o.chunk_bytes, copy = o.single_copy](
                                std::string_view backend, const comm::CommOptions& options) {
    comm::CommOptions with_chunk = options;
    with_chunk.gloo.chain.chunk_bytes = chunk;
    with_chunk.gloo.single_copy.enabled = copy;
    return comm::create_communicator(backend, with_chunk);
  };
  return uo;
}

void note_memory(BenchTable& table, const std::vector<pid_t>& engines, std::uint64_t model,
                 std::uint64_t bucket) {
  char buf[256];
  for (std::size_t e = 0; e < engines.size(); ++e) {
    std::snprintf(buf, sizeof(buf),
                  "engine %zu peak RSS %s (weights %s, budget weights x 2 + 2 x bucket + 64 MiB "
                  "= %s), CPU %.2f s",
                  e, format_bytes(peak_rss(engines[e])).c_str(), format_bytes(model).c_str(),
                  format_bytes(2 * model + 2 * bucket + (64u << 20)).c_str(),
                  cpu_seconds(engines[e]));
    table.note(buf);
  }
  std::snprintf(buf, sizeof(buf),
                "source peak RSS %s (model %s; budget model + 2 x bucket + 64 MiB = %s), CPU %.2f "
                "s on %ld cores",
                format_bytes(self_peak_rss()).c_str(), format_bytes(model).c_str(),
                format_bytes(model + 2 * bucket + (64u << 20)).c_str(), cpu_seconds(getpid()),
                sysconf(_SC_NPROCESSORS_ONLN));
  table.note(buf);
}

// One engine set and the updater that feeds it: "full" (--delta off), "auto" or "on".
struct UpdateSet {
  std::string mode;
  LocalEngines local;
  std::vector<std::string> urls;
  std::unique_ptr<sync::trainer::DistributedUpdater> updater;
  double seconds = 0;  // summed over steps after the first
  std::uint64_t wire = 0;
  int ok = 0;
};

// The weights of each step: the generator's step k (jump) or realistic drift from step 0. They
// live in a TensorArena, written in place each step as a trainer's conversion would write them,
// so buckets go out without a pack pass. With `digest_at_write` each tensor is hashed right after
// it is written, while it is in the cache, and its view carries the digest (NamedTensor::digest),
// as weightcast-train's stage does; that time is kept apart from the update's.
class StepWeights {
 public:
  StepWeights(const std::vector<sync::TensorMeta>& metas, bool realistic, double lr,
              bool digest_at_write)
      : metas_(metas), storage_(metas) {
    if (digest_at_write) digests_.resize(metas.size());
    for (std::size_t i = 0; i < metas.size(); ++i) {
      if (!realistic) continue;
      sync::fill_tensor(metas[i], 1, 0, storage_[i]);
      drifts_.emplace_back(metas[i].dtype, storage_[i], 1, lr);
    }
  }
  // Moves to `step`; returns the fraction of elements that changed (1 for jumps).
  double advance(int step) {
    digest_seconds_ = 0;
    if (drifts_.empty()) {
      for (std::size_t i = 0; i < metas_.size(); ++i) {
        sync::fill_tensor(metas_[i], 1, static_cast<std::uint64_t>(step), storage_[i]);
        digest(i);
      }
      return 1.0;
    }
    std::size_t changed = 0;
    std::size_t total = 0;
    for (std::size_t i = 0; i < drifts_.size(); ++i) {
      changed += drifts_[i].step(static_cast<std::uint64_t>(step), storage_[i]);
      total += drifts_[i].elements();
      digest(i);
    }
    return static_cast<double>(changed) / static_cast<double>(std::max<std::size_t>(total, 1));
  }
  std::vector<sync::trainer::NamedTensor> views() const {
    std::vector<sync::trainer::NamedTensor> out;
    for (std::size_t i = 0; i < metas_.size(); ++i) {
      out.push_back({metas_[i], storage_[i], digests_.empty() ? nullptr : &digests_[i]});
    }
    return out;
  }
  const sync::trainer::TensorArena& storage() const { return storage_; }
  // The last advance()'s hashing, summed over tensors (0 without digest_at_write).
  double digest_seconds() const { return digest_seconds_; }

 private:
  void digest(std::size_t i) {
    if (digests_.empty()) return;
    const auto start = std::chrono::steady_clock::now();
    digests_[i] = sync::tensor_digest(storage_[i]);
    digest_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  const std::vector<sync::TensorMeta>& metas_;
  sync::trainer::TensorArena storage_;
  std::vector<sync::Drift> drifts_;
  std::vector<sync::Digest> digests_;  // one per tensor with digest_at_write, else empty
  double digest_seconds_ = 0;
};

std::vector<UpdateSet> make_sets(const UpdateBenchOptions& o, const std::string& self,
                                 const std::string& spec_path, std::uint64_t model_bytes) {
  // The set under test ("off" is the full set), after the full set when comparing.
  std::vector<std::string> modes;
  if (o.compare_full && o.delta != "off") modes.push_back("off");
  modes.push_back(o.delta);
  std::vector<UpdateSet> sets;
  for (const std::string& mode : modes) {
    UpdateSet set;
    set.mode = mode == "off" ? "full" : mode;
    const bool full_of_two = modes.size() == 2 && mode == "off";
    set.urls = full_of_two ? o.full_engine_urls : o.engine_urls;
    if (set.urls.empty()) {
      set.local = start_engines(o, self, spec_path, model_bytes);
      set.urls = set.local.urls;
    }
    auto uo = updater_options(o);
    uo.delta = sync::trainer::parse_delta_mode(mode);
    uo.delta_codec = sync::parse_delta_codec(o.delta_codec);
    uo.group_prefix = "bench-" + set.mode;
    set.updater = std::make_unique<sync::trainer::DistributedUpdater>(set.urls, uo);
    sets.push_back(std::move(set));
  }
  return sets;
}

BenchTable update_table() {
  return BenchTable("update", {{"step", 6, 0},
                               {"mode", 6, 0},
                               {"seconds", 10, 3},
                               {"GB/s", 9, 3},
                               {"wire", 11, 0},
                               {"changed%", 9, 2},
                               {"buckets", 8, 0},
                               {"delta_bkts", 10, 0},
                               {"data(s)", 9, 3},
                               {"pack(s)", 8, 3},
                               {"hash(s)", 8, 3},
                               {"wire(s)", 8, 3},
                               {"answers(s)", 10, 3},
                               {"commit(s)", 9, 3},
                               {"outside%", 9, 1},
                               {"http_wait%", 10, 1},
                               {"src_peakRSS", 12, 0}});
}

// One run of the bench: the engine sets, the weights of each step, the table and the totals.
class UpdateBench {
 public:
  UpdateBench(const UpdateBenchOptions& o, const std::string& self, const sync::ModelSpec& spec,
              std::string label)
      : o_(o),
        self_(self),
        label_(std::move(label)),
        metas_(sync::hf_tensors(spec)),
        model_bytes_(sync::total_bytes(metas_)),
        spec_file_(write_model_spec(spec)),
        sets_(make_sets(o, self, spec_file_.path(), model_bytes_)),
        weights_(metas_, o.drift == "realistic", sync::kRealisticLr, o.digest_at == "write"),
        table_(update_table()) {}

  // The set under test's mean GB/s over its counted updates (0 when none succeeded).
  double mean_gbps() const {
    const UpdateSet& main_set = sets_.back();
    return main_set.ok && main_set.seconds > 0
               ? static_cast<double>(model_bytes_) * main_set.ok / main_set.seconds / 1e9
               : 0;
  }
  std::uint64_t model_bytes() const { return model_bytes_; }
  std::size_t tensors() const { return metas_.size(); }

  int run() {
    // As a trainer does at start-up (weightcast-train): the buffers of the first update ahead.
    for (UpdateSet& set : sets_) set.updater->reserve_buffers(metas_);
    begin_table();
    for (int step = 1; step <= o_.iters; ++step) run_step(step);
    note_memory_and_stop_engines();
    if (o_.raw) measure_raw();
    table_.write(o_.output);
    return failed_ || table_.wrong() ? 1 : 0;
  }

 private:
  // The head note, then the table's header.
  void begin_table() {
    char head[320];
    std::snprintf(
        head, sizeof(head),
        "weightcast-bench update: %zu engines x %d ranks per set (delta %s%s), model %s%s (%zu "
        "tensors), bucket %s, %d updates, drift %s, codec %s, gloo%s",
        sets_[0].urls.size(), o_.ranks_per_engine, o_.delta.c_str(),
        o_.compare_full ? " vs off" : "", label_.c_str(), format_bytes(model_bytes_).c_str(),
        metas_.size(), format_bytes(o_.bucket_bytes).c_str(), o_.iters, o_.drift.c_str(),
        o_.delta_codec.c_str(), o_.single_copy ? "" : " without single copy");
    table_.begin(head);
  }

  // Every set's update to the weights of `step`, then the delta-vs-full ratio when comparing.
  void run_step(int step) {
    const double changed = weights_.advance(step);
    if (step > 1 || o_.iters == 1) {
      digest_seconds_ += weights_.digest_seconds();
      ++digest_steps_;
    }
    const auto tensors = weights_.views();
    std::vector<sync::trainer::UpdateReport> reports;
    for (UpdateSet& set : sets_) reports.push_back(update_set(set, step, changed, tensors));
    if (sets_.size() == 2 && reports[0].ok && reports[1].ok && step > 1) {
      note_delta_vs_full(step, reports[0], reports[1], changed);
    }
  }

  // One set's update: a row, and the set's sums after the first step. Returns its report.
  sync::trainer::UpdateReport update_set(UpdateSet& set, int step, double changed,
                                         const std::vector<sync::trainer::NamedTensor>& tensors) {
    auto r = set.updater->update(tensors);
    if (!r.ok) {
      table_.note("update " + std::to_string(step) + " (" + set.mode + ") FAILED: " + r.error);
      ++failed_;
      return r;
    }
    if (step == 1) table_.note("set " + set.mode + ": buckets travel by " + r.data_path);
    const std::uint64_t wrong =
        wrong_tensors(set.urls, metas_, weights_.storage(), milliseconds(o_.timeout_ms));
    // Data plane = the bucket phase less the time spent waiting on HTTP answers and packing.
    const double plane = r.phases.data - r.http_wait_seconds - r.pack_wait_seconds;
    table_.add(
        {std::to_string(step), set.mode, r.seconds, r.gbps(), r.wire_bytes, 100 * changed,
         r.buckets, r.delta_buckets, r.phases.data, r.pack_wait_seconds, r.hash_wait_seconds,
         r.wire_seconds, r.http_wait_seconds, r.phases.commit, 100 * (1.0 - plane / r.seconds),
         100 * r.http_wait_seconds / r.seconds, format_bytes(self_peak_rss())},
        wrong);
    if (step > 1 || o_.iters == 1) {
      set.seconds += r.seconds;
      set.wire += r.wire_bytes;
      set.ok += 1;
    }
    return r;
  }

  void note_delta_vs_full(int step, const sync::trainer::UpdateReport& full,
                          const sync::trainer::UpdateReport& delta, double changed) {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "step %d: delta %s vs full: %.1fx less on the wire, %.2fx faster end to end "
                  "(%.2f%% of elements changed)",
                  step, sets_[1].mode.c_str(),
                  static_cast<double>(full.wire_bytes) / static_cast<double>(delta.wire_bytes),
                  full.seconds / delta.seconds, 100 * changed);
    table_.note(buf);
  }

  void note_memory_and_stop_engines() {
    std::vector<pid_t> pids;
    for (auto& set : sets_) {
      for (const auto& p : set.local.processes) pids.push_back(p->pid());
    }
    note_memory(table_, pids, model_bytes_, o_.bucket_bytes);
    for (auto& set : sets_) set.local.processes.clear();
  }

  // The raw chain broadcast of the same bytes to as many ranks as the set under test has.
  void measure_raw() {
    const UpdateSet& main_set = sets_.back();
    const double update_s = main_set.ok ? main_set.seconds / main_set.ok : 0;
    const int receivers = static_cast<int>(main_set.urls.size()) * o_.ranks_per_engine;
    const double raw_s = raw_chain_seconds(o_, self_, model_bytes_, receivers);
    table_.add(
        {std::string("raw"), std::string("-"), raw_s,
         static_cast<double>(model_bytes_) / raw_s / 1e9, model_bytes_, 0.0, std::uint64_t{1},
         std::uint64_t{0}, raw_s, 0.0, 0.0, raw_s, 0.0, 0.0, 0.0, 0.0, std::string("-")},
        0);
    if (!main_set.ok) return;
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "update (%s) avg %.3f s (%.3f GB/s); raw gloo-chain of the same %s to %d ranks "
                  "%.3f s; update / raw = %.2fx of raw throughput; #wrong total %llu",
                  main_set.mode.c_str(), update_s,
                  static_cast<double>(model_bytes_) / update_s / 1e9,
                  format_bytes(model_bytes_).c_str(), receivers, raw_s, raw_s / update_s,
                  static_cast<unsigned long long>(table_.wrong()));
    table_.note(buf);
    if (o_.digest_at == "write" && digest_steps_ > 0) {
      const double digest_s = digest_seconds_ / digest_steps_;
      std::snprintf(buf, sizeof(buf),
                    "the source's digests were made as the weights were written: %.3f s per "
                    "step outside the update (update + them / raw = %.2fx; --digest-at send "
                    "hashes inside the update)",
                    digest_s, raw_s / (update_s + digest_s));
      table_.note(buf);
    }
  }

  const UpdateBenchOptions& o_;
  const std::string& self_;
  const std::string label_;  // "moe-1g " or empty
  const std::vector<sync::TensorMeta> metas_;
  const std::uint64_t model_bytes_;
  const TempFile spec_file_;
  std::vector<UpdateSet> sets_;
  StepWeights weights_;
  double digest_seconds_ = 0;  // the source's digests at write, summed over steps after the first
  int digest_steps_ = 0;
  BenchTable table_;
  int failed_ = 0;
};

}  // namespace

int run_update_bench(const UpdateBenchOptions& o, const std::string& self) {
  if (o.models.empty()) {
    return UpdateBench(o, self, sync::model_spec_for_bytes(o.model_bytes), "").run();
  }
  // Each model in turn, fresh engines each, then their GB/s side by side (against the first);
  // with several rounds, every other round reversed, and each model's median ratio.
  int code = 0;
  const std::size_t n = o.models.size();
  std::vector<std::vector<double>> gbps(n);  // [model][round]
  std::vector<std::uint64_t> bytes(n);
  std::vector<std::size_t> tensors(n);
  for (int round = 0; round < o.rounds; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t m = round % 2 == 0 ? k : n - 1 - k;
      const std::string& name = o.models[m];
      if (o.rounds > 1) std::printf("# round %d of %d: %s\n", round + 1, o.rounds, name.c_str());
      UpdateBench bench(o, self, sync::model_preset(name), name + " ");
      code = std::max(code, bench.run());
      gbps[m].push_back(bench.mean_gbps());
      bytes[m] = bench.model_bytes();
      tensors[m] = bench.tensors();
    }
  }
  std::printf("# models in this run (mean of updates after the first%s):\n",
              o.rounds > 1 ? "; per round, rounds in order" : "");
  for (std::size_t m = 0; m < n; ++m) {
    std::vector<double> ratios;
    std::string per_round;
    for (std::size_t r = 0; r < gbps[m].size(); ++r) {
      const double first = gbps[0][r];
      ratios.push_back(first > 0 ? gbps[m][r] / first : 0.0);
      char cell[64];
      std::snprintf(cell, sizeof(cell), "%s%.3f GB/s %.2fx", r == 0 ? "" : ", ", gbps[m][r],
                    ratios.back());
      per_round += cell;
    }
    std::sort(ratios.begin(), ratios.end());
    const std::size_t half = ratios.size() / 2;
    const double median =
        ratios.size() % 2 == 1 ? ratios[half] : (ratios[half - 1] + ratios[half]) / 2;
    std::printf("#   %-14s %10s %6zu tensors: %s; median %.2fx of %s\n", o.models[m].c_str(),
                format_bytes(bytes[m]).c_str(), tensors[m], per_round.c_str(), median,
                o.models.front().c_str());
  }
  std::fflush(stdout);
  return code;
}

}  // namespace weightcast::launcher
