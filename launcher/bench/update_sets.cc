#include "launcher/bench/update_sets.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "launcher/bench/engines.h"
#include "launcher/bench/hosts.h"
#include "launcher/bench/process_stats.h"
#include "launcher/cli_util.h"
#include "sync/model/checksum.h"
#include "sync/trainer/http/engine_client.h"

namespace weightcast::launcher {

using std::chrono::milliseconds;

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
  uo.keep_alive = !o.no_keep_alive;
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

std::vector<UpdateSet> make_sets(const UpdateBenchOptions& o, const std::string& self,
                                 const std::string& spec_path, std::uint64_t model_bytes) {
  // The set under test, after the full set (delta "off") or the chain set (colocate "off") when
  // comparing.
  struct Spec {
    std::string label, delta, colocate;
    bool first_of_two = false;
  };
  std::vector<Spec> specs;
  if (o.compare_full && o.delta != "off") specs.push_back({"full", "off", o.colocate, true});
  if (o.compare_colocate) specs.push_back({"chain", o.delta, "off", true});
  specs.push_back({o.delta == "off" ? "full" : o.delta, o.delta, o.colocate, false});
  if (o.compare_colocate) specs.back() = {"colocated", o.delta, "on", false};
  std::vector<UpdateSet> sets;
  for (const Spec& spec : specs) {
    UpdateSet set;
    set.mode = spec.label;
    set.urls = spec.first_of_two ? o.full_engine_urls : o.engine_urls;
    if (set.urls.empty()) {
      set.local = start_engines(o, self, spec_path, model_bytes);
      set.urls = set.local.urls;
    }
    auto uo = updater_options(o);
    uo.delta = sync::trainer::parse_delta_mode(spec.delta);
    uo.delta_codec = sync::parse_delta_codec(o.delta_codec);
    uo.colocate = sync::trainer::parse_colocate_mode(spec.colocate);
    uo.group_prefix = "bench-" + set.mode;
    set.updater = std::make_unique<sync::trainer::DistributedUpdater>(set.urls, uo);
    sets.push_back(std::move(set));
  }
  return sets;
}

std::vector<std::string> update_engine_argv(const UpdateBenchOptions& o, const std::string& self,
                                            const std::string& spec_path, std::uint64_t model_bytes,
                                            const std::string& host) {
  std::vector<std::string> argv{beside_self(self, "engine/weightcast-engine"),
                                "--host",
                                host,
                                "--port",
                                "0",
                                "--ranks",
                                std::to_string(o.ranks_per_engine),
                                "--model",
                                spec_path,
                                "--seed",
                                "1",
                                "--max-bucket-bytes",
                                std::to_string(std::max(o.bucket_bytes, model_bytes)),
                                "--chunk-bytes",
                                std::to_string(o.chunk_bytes),
                                "--comm-timeout-ms",
                                std::to_string(o.timeout_ms),
                                "--session-timeout-ms",
                                std::to_string(o.timeout_ms)};
  if (o.no_kept_mappings) argv.push_back("--no-kept-mappings");
  return argv;
}

}  // namespace weightcast::launcher
