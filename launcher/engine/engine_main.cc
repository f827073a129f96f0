// weightcast-engine: a rollout engine that receives weight updates over the protocol of
// docs/protocol.md (SGLang-compatible routes, selector-scoped sessions, bucketed broadcasts).
//
//   weightcast-engine --port 0 --model tiny --seed 1 --target-layout shuffle
//       --draft --draft-layout shuffle --draft-filter 'mtp.*'     (one command line)
//
// Prints one line "weightcast-engine listening on http://HOST:PORT" once it accepts requests
// (scripts read the port from it), serves until SIGINT/SIGTERM, and exits 0. Exit 2 on bad
// arguments or configuration.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "comm/errors.h"
#include "comm/stop_signals.h"
#include "launcher/cli_options.h"
#include "launcher/cli_util.h"
#include "launcher/engine/engine_setup.h"
#include "launcher/malloc_tuning.h"
#include "sync/engine/http/routes.h"

namespace {

using weightcast::launcher::EngineArgs;
using weightcast::launcher::one_of;
using weightcast::launcher::ranged;
using weightcast::launcher::RunnerArgs;
using weightcast::launcher::with_default;
using weightcast::sync::engine::Engine;
using weightcast::sync::engine::HttpServer;

// The parsed command line: the engine's arguments and what main turns into options itself.
struct CommandLine {
  EngineArgs args;
  std::string allowed_masters;  // comma-separated, as typed
};

void add_runner_options(CLI::App& app, const std::string& name, RunnerArgs& r) {
  with_default(app, "--" + name + "-filter", r.filter,
               "comma-separated fnmatch globs of the tensor names the " + name +
                   " runner loads (empty: none)");
  one_of(app, "--" + name + "-layout", r.layout, "post-load layout: none or shuffle",
         {"none", "shuffle"});
  app.add_option("--" + name + "-safetensors", r.safetensors,
                 "initial weights of the " + name +
                     " runner from a safetensors file instead of "
                     "--model/--seed");
}

// Where the engine listens, who may call it, and how many ranks it has.
void add_server_options(CLI::App& app, EngineArgs& a) {
  with_default(app, "--host", a.host, "address to bind (HTTP, and the data plane by default)");
  ranged(app, "--port", a.port, "HTTP port; 0 picks an ephemeral one", 0, 65535);
  app.add_option("--token", a.token,
                 "bearer token required on every route but /health and /metrics");
  ranged(app, "--ranks,--tp-size", a.ranks,
         "engine ranks (TP size); each is a member of every weight update group", 1, 64);
}

// The runners and their initial weights.
void add_model_options(CLI::App& app, EngineArgs& a) {
  app.add_flag("--draft", a.draft, "hold a draft runner (speculative decoding) besides the target");
  add_runner_options(app, "target", a.target);
  add_runner_options(app, "draft", a.draft_runner);
  with_default(app, "--model", a.model,
               "model preset (tiny, small, ...) or an HF config.json path");
  with_default(app, "--seed", a.seed, "seed of the deterministic initial weights (step 0)");
  with_default(app, "--weight-version", a.weight_version, "initial weight_version");
  app.add_flag("--no-colocate", a.no_colocate,
               "take no colocated buckets (POST /update_weights_from_tensor answers 403) and do "
               "not offer them in /server_info: same-host trainers then use the group");
  app.add_flag("--no-kept-mappings", a.no_kept_mappings,
               "colocated path: map each bucket's segment afresh and read it with pread, instead "
               "of keeping the mapping between updates while the trainer keeps the segment "
               "(docs/colocated.md, \"Kept mappings\")");
  app.add_flag("--legacy-finalize", a.legacy_finalize,
               "old finalize: end_weight_update re-applies the layout to every resident tensor "
               "of every covered runner (reproduces the double-shuffle bug)");
  app.add_option("--frozen-runner", a.frozen_runners,
                 "a runner (target or draft) that updates without a session (slime, plain "
                 "SGLang clients) never touch; a frozen speculative draft (repeatable)")
      ->check(CLI::IsMember({"target", "draft"}));
  app.add_flag("--sessionless-updates-frozen", a.sessionless_updates_frozen,
               "let updates without a session touch --frozen-runner runners after all");
  app.add_option("--speculative-algorithm", a.speculative_algorithm,
                 "reported in /server_info (default EAGLE with --draft, else none)");
  ranged(app, "--ep-size", a.ep_size,
         "expert parallelism over the engine's ranks (divides --ranks; MoE models): each rank "
         "holds its EP rank's routed experts, reported in /server_info as SGLang reports it",
         1, 1024);
  with_default(app, "--expert-placement", a.expert_placement,
               "which experts an EP rank holds: linear (contiguous blocks, SGLang and vLLM's "
               "default) or round_robin (vLLM)")
      ->check(CLI::IsMember({"linear", "round_robin"}));
  with_default(app, "--shard-plan", a.shard_plan,
               "announce each rank's shard plan in /server_info so that each rank receives only "
               "its slices (docs/sharding.md): none, or tensor-parallel (vLLM's and SGLang's "
               "rules for --ranks TP ranks and --ep-size)")
      ->check(CLI::IsMember({"none", "tensor-parallel"}));
}

void add_timeout_options(CLI::App& app, EngineArgs& a) {
  ranged(app, "--init-timeout-ms", a.init_timeout_ms, "deadline to join a group", 1, 3600000);
  ranged(app, "--comm-timeout-ms", a.comm_timeout_ms, "deadline of each bucket's broadcast", 1,
         3600000);
  ranged(app, "--session-timeout-ms", a.session_timeout_ms,
         "an update session without a request for this long is aborted; generation "
         "paused with no session and no request for this long is resumed",
         1, 86400000);
  ranged(app, "--lease-ttl-s", a.lease_ttl_s,
         "a trainer's lease on this engine lasts this long after its last session unless "
         "its begin asks for another time",
         1, 86400);
  ranged(app, "--http-timeout-ms", a.http_timeout_ms,
         "HTTP socket read/write timeout, and the most one request (head and body) may "
         "take to arrive",
         1, 3600000);
}

// Sizes checked before allocating, and the HTTP worker pool.
void add_limit_options(CLI::App& app, EngineArgs& a) {
  with_default(app, "--max-bucket-bytes", a.max_bucket_bytes,
               "largest bucket accepted, checked before allocating (K/M/G suffixes)");
  with_default(app, "--max-body-bytes", a.max_body_bytes, "largest HTTP body accepted");
  with_default(app, "--max-file-bytes", a.max_file_bytes, "largest safetensors file accepted");
  ranged(app, "--http-threads", a.http_threads, "HTTP worker threads", 4, 1024);
  ranged(app, "--max-buckets-ahead", a.max_buckets_ahead,
         "bucket requests that may wait for an earlier bucket (must be < --http-threads)", 1, 1000);
}

// The weight update groups' data plane and rendezvous.
void add_data_plane_options(CLI::App& app, CommandLine& c) {
  app.add_option("--comm-address", c.args.comm_address,
                 "data-plane address to bind and advertise (default: --host)");
  app.add_option("--store-token", c.args.store_token, "token of the trainers' rendezvous store");
  app.add_option("--allowed-master-addresses", c.allowed_masters,
                 "comma-separated master_address values init_weights_update_group may connect "
                 "to, compared as text (default: any)");
  with_default(app, "--chunk-bytes", c.args.chunk_bytes, "Gloo chain chunk size");
  app.add_flag("--allow-same-user-reads", c.args.allow_same_user_reads,
               "Gloo groups: let processes of this user read this engine's memory "
               "(PR_SET_PTRACER_ANY), so same-host single copy works under Yama ptrace_scope 1; "
               "every member of the group needs it (docs/security.md)");
  app.add_flag("!--no-single-copy", c.args.single_copy,
               "Gloo groups: never copy buckets straight out of a trainer's memory on the same "
               "host; one member with this flag keeps its whole group on sockets and Gloo");
  with_default(app, "--base-gpu-id", c.args.base_gpu_id,
               "nccl groups: engine rank i uses CUDA device base-gpu-id + i (SGLang's name)");
}

void add_options(CLI::App& app, CommandLine& c) {
  add_server_options(app, c.args);
  add_model_options(app, c.args);
  add_timeout_options(app, c.args);
  add_limit_options(app, c.args);
  add_data_plane_options(app, c);
}

// The engine's options with --allowed-master-addresses applied; throws comm::ConfigError.
weightcast::sync::engine::EngineOptions engine_options(const CommandLine& c) {
  auto options = weightcast::launcher::make_engine_options(c.args);
  for (auto item : weightcast::launcher::split_csv(c.allowed_masters)) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) options.allowed_master_addresses.push_back(item);
  }
  if (!c.allowed_masters.empty() && options.allowed_master_addresses.empty()) {
    throw weightcast::comm::ConfigError("--allowed-master-addresses: no address given");
  }
  return options;
}

// Until stopped, waits for SIGINT/SIGTERM among `signals`; one shuts the engine and server down.
std::jthread watch_stop_signals(const sigset_t& signals, Engine& engine, HttpServer& server) {
  return std::jthread([&signals, &engine, &server](std::stop_token stop) {
    const timespec period{0, 200 * 1000 * 1000};
    while (!stop.stop_requested()) {
      if (sigtimedwait(&signals, nullptr, &period) > 0) {
        engine.shutdown();
        server.stop();
        return;
      }
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  weightcast::launcher::tune_malloc_for_updates();  // launcher/malloc_tuning.h
  CommandLine c;
  CLI::App app{"weightcast-engine: a rollout engine that receives weight updates"};
  add_options(app, c);
  CLI11_PARSE(app, argc, argv);
  const EngineArgs& a = c.args;

  if (a.max_buckets_ahead + 2 > a.http_threads) {
    std::fprintf(stderr, "weightcast-engine: --max-buckets-ahead %d needs --http-threads >= %d\n",
                 a.max_buckets_ahead, a.max_buckets_ahead + 2);
    return 2;
  }
  // Taken by one thread with sigwait, so no handler runs inside library code.
  const sigset_t signals = weightcast::comm::block_stop_signals();

  std::unique_ptr<Engine> engine;
  std::unique_ptr<HttpServer> server;
  try {
    auto options = engine_options(c);
    engine = std::make_unique<Engine>(std::move(options), weightcast::launcher::make_runners(a));
    server = std::make_unique<HttpServer>(weightcast::sync::engine::engine_routes(*engine),
                                          weightcast::launcher::make_server_options(a));
  } catch (const weightcast::comm::Error& e) {
    std::fprintf(stderr, "weightcast-engine: %s\n", e.what());
    return 2;
  }

  if (a.token.empty() && !weightcast::launcher::loopback_host(a.host)) {
    std::fprintf(stderr,
                 "weightcast-engine: WARNING: listening on %s without --token: anyone who can "
                 "reach this address can update, abort or break the lease of this engine\n",
                 a.host.c_str());
  }
  std::jthread waiter = watch_stop_signals(signals, *engine, *server);
  std::printf("weightcast-engine listening on %s\n", server->url().c_str());
  std::fflush(stdout);
  server->run();
  waiter.request_stop();
  waiter.join();
  server.reset();
  engine.reset();
  return 0;
}
