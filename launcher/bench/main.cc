// weightcast-bench: benchmarks that print ratios against peers measured in the same run.
//
//   weightcast-bench broadcast --ranks 3 --min-bytes 1M --max-bytes 1G
//
// Started directly it re-executes itself under mpirun with --ranks processes; started by mpirun
// it runs on the ranks it was given. See docs/performance.md for every mode and how to reproduce
// the published numbers.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "launcher/bench/broadcast.h"
#include "launcher/bench/codec.h"
#include "launcher/bench/engines.h"
#include "launcher/bench/hosts.h"
#include "launcher/bench/hosts_ep.h"
#include "launcher/bench/requests.h"
#include "launcher/bench/update.h"
#include "launcher/child_process.h"
#include "launcher/cli_options.h"
#include "launcher/cli_util.h"
#include "launcher/malloc_tuning.h"
#include "launcher/mpi_launch.h"

namespace {

using namespace weightcast::launcher;

std::string default_backends() {
  std::string b = "gloo-chain,gloo-stock,mpi-bcast";
  for (const auto& name : weightcast::comm::available_backends()) {
    if (name == "nccl") b += ",nccl";
  }
  return b;
}

void add_output_options(CLI::App& mode, BenchOutput& out) {
  mode.add_option("--csv", out.csv_path, "also write the result rows to this CSV file");
  mode.add_option("--json", out.json_path,
                  "also write the result rows and notes to this JSON file");
}

// "1,2,4": TP sizes of 1 to 16, comma separated (the shard-aware broadcast of the hosts mode).
std::vector<int> parse_tp_sizes(const std::string& option, const std::string& text) {
  std::vector<int> out;
  for (const auto& item : split_csv(text)) {
    char* end = nullptr;
    const long tp = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || tp < 1 || tp > 16) {
      throw CLI::ValidationError(
          option, "TP sizes from 1 to 16, comma separated, not '" + item + "' in '" + text + "'");
    }
    out.push_back(static_cast<int>(tp));
  }
  return out;
}

void on_alarm(int) {
  const char msg[] = "weightcast-bench: --max-seconds passed; aborting the run\n";
  (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
  _exit(124);
}

// A size option written with K/M/G suffixes, parsed into `target` as it is read.
CLI::Option* bytes_option(CLI::App& mode, const std::string& name, std::uint64_t& target,
                          const std::string& help) {
  return mode
      .add_option_function<std::string>(
          name, [&target](const std::string& text) { target = parse_bytes(text); }, help)
      ->default_str(format_bytes(target));
}

// The gloo-chain pipeline of the modes that run it: chunk size and chunks in flight.
void add_chain_options(CLI::App& mode, std::uint64_t& chunk_bytes, int& chunks_in_flight) {
  bytes_option(mode, "--chunk-bytes", chunk_bytes, "gloo-chain chunk size");
  ranged(mode, "--in-flight", chunks_in_flight, "gloo-chain chunks in flight per link", 1, 64);
}

CLI::App* add_broadcast(CLI::App& app, BroadcastBenchOptions& bo, int& ranks) {
  auto* bc = app.add_subcommand("broadcast", "broadcast bandwidth table, ours against peers");
  ranged(*bc, "--ranks", ranks, "processes to start when not already under mpirun", 1, 256);
  bc->add_option_function<std::string>(
        "--backends", [&bo](const std::string& text) { bo.backends = split_csv(text); },
        "comma list: gloo-chain, gloo-unbound (the chain without its eager ring), gloo-sockets "
        "(the chain without single copy), gloo-stock, mpi-bcast, colocate (the colocated "
        "segment: the root writes, the others read), colocate-hash (their reads hashed, as an "
        "engine's), colocate-arena (the root's bytes already in the segment, as the trainer's "
        "arena), colocate-arena-hash (both: the colocated update's data plane), "
        "colocate-arena-map-hash (its readers memcpy out of a mapping kept from setup, not "
        "pread), nccl")
      ->default_str(default_backends());
  bytes_option(*bc, "--min-bytes", bo.min_bytes, "smallest size (K/M/G suffixes)");
  bytes_option(*bc, "--max-bytes", bo.max_bytes, "largest size");
  ranged(*bc, "--factor", bo.factor, "size multiplier per row", 2, 16);
  ranged(*bc, "--warmup", bo.warmup, "untimed iterations per row", 0, 1000);
  ranged(*bc, "--iters", bo.iters, "timed iterations per row", 1, 100000);
  with_default(*bc, "--root", bo.root, "broadcast root rank");
  add_chain_options(*bc, bo.chunk_bytes, bo.chunks_in_flight);
  bytes_option(*bc, "--eager-max-bytes", bo.eager_max_bytes,
               "gloo-chain: broadcasts up to this size take the eager ring (0: never)");
  bytes_option(*bc, "--single-copy-min-bytes", bo.single_copy_min_bytes,
               "gloo-chain: broadcasts of at least this size are copied out of the root's "
               "memory when all ranks share a host");
  with_default(*bc, "--bind", bo.bind_address, "address the store and Gloo bind");
  ranged(*bc, "--timeout-ms", bo.timeout_ms, "deadline of every collective", 1, 3600000);
  // Internal: the two MPI jobs of one run (run_broadcast_mode).
  bc->add_option("--mpi-tcp-rows-out", bo.mpi_tcp_rows_out)->group("");
  bc->add_option("--mpi-tcp-rows-in", bo.mpi_tcp_rows_in)->group("");
  add_output_options(*bc, bo.output);
  return bc;
}

CLI::App* add_hosts(CLI::App& app, HostsBenchOptions& ho) {
  auto* hs = app.add_subcommand(
      "hosts", "chain vs stock Gloo between network namespaces with shaped links (needs root)");
  ranged(*hs, "--receivers", ho.receivers, "receiving hosts", 1, 16);
  with_default(*hs, "--rate", ho.rate, "tc tbf rate of every host link (kbit/mbit/gbit)");
  bytes_option(*hs, "--bytes", ho.bytes, "bytes per broadcast");
  ranged(*hs, "--iters", ho.iters, "timed broadcasts per backend (and updates)", 1, 1000);
  ranged(*hs, "--timeout-ms", ho.timeout_ms, "deadline of each broadcast, update and trainer step",
         1, 3600000);
  add_chain_options(*hs, ho.chunk_bytes, ho.chunks_in_flight);
  bytes_option(*hs, "--update-model-bytes", ho.update_model_bytes,
               "also time the end-to-end update of a model of this size (0: off)");
  bytes_option(*hs, "--update-bucket-bytes", ho.update_bucket_bytes, "bucket size of that update");
  one_of(*hs, "--update-drift", ho.update_drift,
         "weights of that update: jump, or realistic (then full and delta updates of the "
         "same steps on two engine sets, one after the other)",
         {"jump", "realistic"});
  ranged(*hs, "--trainer-ep", ho.trainer_ep,
         "also time weightcast-train's EP stage: this many EP ranks (2 or more), one per host, "
         "with the expert gather whole and overlapped (0: off; runs train/weightcast-train "
         "next to this program, as in the build tree)",
         0, 8)
      ->check([](const std::string& text) {
        return text == "1" ? std::string("one EP rank has nothing to gather: use 0 or 2-8")
                           : std::string();
      });
  with_default(*hs, "--trainer-model", ho.trainer_model, "that run's MoE model preset");
  bytes_option(*hs, "--trainer-bucket-bytes", ho.trainer_bucket_bytes,
               "that run's bucket size (and overlap's gather group)");
  ranged(*hs, "--trainer-steps", ho.trainer_steps, "that run's steps per gather mode", 2, 1000);
  ranged(*hs, "--trainer-engines", ho.trainer_engines, "that run's engines, one host each", 1, 8);
  hs->add_option_function<std::string>(
        "--trainer-gathers",
        [&ho](const std::string& text) {
          ho.trainer_gathers = split_csv(text);
          for (const auto& g : ho.trainer_gathers) {
            if (g != "whole" && g != "overlap" && g != "auto") {
              throw CLI::ValidationError("--trainer-gathers",
                                         "whole, overlap or auto, comma separated: " + g);
            }
          }
        },
        "that run's --tp-gather modes, comma separated, one run each (whole,overlap; the "
        "overlap-vs-whole note needs both)")
      ->default_str("whole,overlap");
  hs->add_option_function<std::string>(
      "--shard-tps",
      [&ho](const std::string& text) { ho.shard_tps = parse_tp_sizes("--shard-tps", text); },
      "also shard-aware broadcast against full broadcast: the receiving hosts are the ranks of "
      "engines of each of these TP sizes, comma separated, e.g. 1,2,4 (each must divide "
      "--receivers; off by default)");
  hs->add_option("--shard-source-rate", ho.shard_source_rate,
                 "host 0's link rate for that run (default: --rate times the largest TP size, a "
                 "trainer node with a NIC per GPU)");
  bytes_option(*hs, "--shard-bucket-bytes", ho.shard_bucket_bytes,
               "that run's bucket size (and the sharded update's)");
  hs->add_option_function<std::string>(
      "--shard-update-tps",
      [&ho](const std::string& text) {
        ho.shard_update_tps = parse_tp_sizes("--shard-update-tps", text);
      },
      "also the whole update (weightcast-train, HTTP, staging, --verify), sliced against full: "
      "torch reference engines of each of these TP sizes, their workers the receiving hosts "
      "(each must divide --receivers; off by default; needs --python)");
  with_default(*hs, "--shard-update-model", ho.shard_update_model, "that run's model preset");
  ranged(*hs, "--shard-update-steps", ho.shard_update_steps,
         "that run's steps per mode (the mean is of steps 2..)", 2, 1000);
  with_default(*hs, "--python", ho.python,
               "interpreter that imports torch and the weightcast package (PYTHONPATH from the "
               "environment, else the build tree's python folder)");
  add_output_options(*hs, ho.output);
  return hs;
}

CLI::App* add_hosts_worker(CLI::App& app, HostsWorkerOptions& wo) {
  auto* hw = app.add_subcommand("hosts-worker", "one host of the hosts mode (internal)");
  hw->group("");  // not listed in --help
  hw->add_option("--rank", wo.rank)->required();
  hw->add_option("--size", wo.size)->required();
  hw->add_option("--bind", wo.bind_address)->required();
  hw->add_option("--store-host", wo.store_host)->required();
  hw->add_option("--store-port", wo.store_port)->required();
  bytes_option(*hw, "--bytes", wo.bytes, "bytes per broadcast")->required();
  hw->add_option("--iters", wo.iters);
  bytes_option(*hw, "--chunk-bytes", wo.chunk_bytes, "gloo-chain chunk size");
  hw->add_option("--in-flight", wo.chunks_in_flight);
  hw->add_option("--timeout-ms", wo.timeout_ms);
  hw->add_option("--single-copy", wo.single_copy);
  hw->add_option_function<std::string>(
      "--backends", [&wo](const std::string& text) { wo.backends = split_csv(text); });
  hw->add_option_function<std::string>("--shard-tps", [&wo](const std::string& text) {
    wo.shard_tps = parse_tp_sizes("--shard-tps", text);
  });
  bytes_option(*hw, "--bucket-bytes", wo.bucket_bytes, "bucket size of the sharded broadcast");
  return hw;
}

// mpirun's rsh agent for the hosts mode's trainer ranks (launcher/bench/hosts_ep.h).
CLI::App* add_netns_agent(CLI::App& app) {
  auto* na =
      app.add_subcommand("netns-agent", "run a command in a hosts-mode namespace (internal)");
  na->group("");
  na->allow_extras();
  na->prefix_command();
  return na;
}

CLI::App* add_update(CLI::App& app, UpdateBenchOptions& uo) {
  auto* up = app.add_subcommand(
      "update",
      "end-to-end update to engine processes vs the raw chain broadcast of the same bytes");
  ranged(*up, "--engines", uo.engines, "engine processes", 1, 32);
  ranged(*up, "--ranks", uo.ranks_per_engine, "ranks per engine", 1, 16);
  bytes_option(*up, "--model-bytes", uo.model_bytes,
               "model size (a Qwen-like model of about this size)");
  up->add_option_function<std::string>(
      "--models", [&uo](const std::string& text) { uo.models = split_csv(text); },
      "model presets to update one after the other in this run, each with fresh engines, "
      "compared at the end (e.g. dense-1g,moe-1g); overrides --model-bytes");
  ranged(*up, "--rounds", uo.rounds,
         "with --models: run the list this many times, every other round reversed, and give each "
         "model's ratio to the first per round and their median",
         1, 100);
  bytes_option(*up, "--bucket-bytes", uo.bucket_bytes, "bucket size");
  bytes_option(*up, "--chunk-bytes", uo.chunk_bytes, "gloo-chain chunk size");
  ranged(*up, "--max-in-flight", uo.max_in_flight, "unanswered bucket requests per engine", 1, 64);
  ranged(*up, "--timeout-ms", uo.timeout_ms, "deadline of each update and broadcast", 1, 3600000);
  ranged(*up, "--iters", uo.iters, "updates (and raw broadcasts) to time", 1, 100);
  up->add_option_function<std::string>(
      "--engine-urls", [&uo](const std::string& text) { uo.engine_urls = split_csv(text); },
      "update these running engines (comma list) instead of starting --engines");
  with_default(*up, "--bind", uo.bind_address, "address the source's store and data plane bind");
  up->add_flag("!--no-raw", uo.raw, "skip the raw chain broadcast comparison");
  up->add_flag("!--no-single-copy", uo.single_copy,
               "keep the source and the raw chain off same-host single copy (sockets and Gloo, as "
               "between hosts)");
  one_of(*up, "--drift", uo.drift,
         "weights per step: jump (every element changes) or realistic (fp32 masters "
         "drift and round to bf16: a few percent change)",
         {"jump", "realistic"});
  one_of(*up, "--digest-at", uo.digest_at,
         "where the source's tensor digests are made: write (as each tensor is written, in the "
         "cache, outside the timed update, as weightcast-train does) or send (the sender hashes "
         "every tensor during the update)",
         {"write", "send"});
  one_of(*up, "--delta", uo.delta,
         "delta updates: auto (when the link is slow enough to pay), on (whenever "
         "smaller) or off (full buckets)",
         {"auto", "on", "off"});
  up->add_flag("--compare-full", uo.compare_full,
               "also feed the same steps to a second engine set with --delta off, for "
               "delta-vs-full ratios");
  one_of(*up, "--delta-codec", uo.delta_codec, "delta payload codec (sync/model/delta.h)",
         {"xor_zstd", "xor_lz4", "sparse"});
  one_of(*up, "--colocate", uo.colocate,
         "the colocated path for the engines on this host (docs/colocated.md): on, auto or off",
         {"off", "on", "auto"});
  up->add_flag("--compare-colocate", uo.compare_colocate,
               "feed the same steps to an engine set on the chain and then to one through the "
               "colocated path, for colocated-vs-chain ratios")
      ->excludes("--compare-full")
      ->excludes("--colocate");
  up->add_flag("--no-kept-mappings", uo.no_kept_mappings,
               "start the engines with --no-kept-mappings: the colocated path maps each bucket "
               "afresh and reads it with pread (docs/colocated.md, \"Kept mappings\")");
  up->add_flag("--no-keep-alive", uo.no_keep_alive,
               "a new HTTP connection for every engine request, as before connections were reused "
               "within an update (docs/performance.md, \"Control plane\")");
  up->add_option_function<std::string>(
      "--full-engine-urls",
      [&uo](const std::string& text) { uo.full_engine_urls = split_csv(text); },
      "with --compare-full and --engine-urls: the engines of the full set");
  add_output_options(*up, uo.output);
  return up;
}

CLI::App* add_codec(CLI::App& app, CodecBenchOptions& co) {
  auto* cd = app.add_subcommand(
      "codec", "the delta codecs on realistically drifting buckets: size, speed, exactness");
  bytes_option(*cd, "--model-bytes", co.model_bytes,
               "model size (a Qwen-like model of about this size)");
  bytes_option(*cd, "--bucket-bytes", co.bucket_bytes, "bucket size");
  ranged(*cd, "--steps", co.steps, "training steps to encode", 1, 100);
  cd->add_option("--lr", co.lr, "drift step size (0: the realistic rate)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_output_options(*cd, co.output);
  return cd;
}

CLI::App* add_requests(CLI::App& app, RequestsBenchOptions& ro) {
  auto* rq = app.add_subcommand(
      "requests", "what a bucket request costs per tensor to build and to parse, vs nlohmann");
  ranged(*rq, "--tensors", ro.tensors,
         "tensors in the bucket request (at most the protocol's names per bucket)", 1, 65536);
  ranged(*rq, "--iters", ro.iters, "builds and parses to time", 1, 100000);
  return rq;
}

std::string self_path(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string(argv0);
}

// MPI_Bcast over TCP first, in a job of its own (btl self,tcp: the transport between hosts),
// timing mpi-bcast alone; its rows go to a file the main job reads. Returns that file's path.
std::string run_mpi_tcp_job(int ranks, std::vector<std::string> args) {
  TempFile rows("weightcast-bench-mpi-tcp", "");
  args.insert(args.end(), {"--mpi-tcp-rows-out", rows.path()});
  ChildProcess job(mpirun_argv(ranks, args, {"btl=self,tcp"}));
  const std::chrono::seconds limit(3600);  // the whole run is bounded by --max-seconds anyway
  job.drain(limit);
  const int code = job.wait_exit(limit);
  if (code != 0) {
    throw std::runtime_error("the MPI_Bcast-over-TCP job failed (exit " + std::to_string(code) +
                             "): " + job.output());
  }
  return rows.release();
}

// The broadcast mode runs on every rank of an MPI job, started directly or by mpirun.
int run_broadcast_mode(int argc, char** argv, int ranks, const BroadcastBenchOptions& bo) {
  if (!under_mpirun()) {
    std::vector<std::string> args(argv, argv + argc);
    const bool mpi =
        std::find(bo.backends.begin(), bo.backends.end(), "mpi-bcast") != bo.backends.end();
    if (!mpi) relaunch_under_mpirun(ranks, args, {"btl=self,tcp"});
    // On one host our chain copies once per receiver out of the root's memory (single copy), as
    // Open MPI's shared-memory transport does: MPI_Bcast runs over both transports, shared
    // memory (vader) in the main job beside ours, TCP (the peer between hosts) in a job before it.
    const std::string rows = run_mpi_tcp_job(ranks, args);
    args.insert(args.end(), {"--mpi-tcp-rows-in", rows});
    relaunch_under_mpirun(ranks, args, {"btl=self,vader,tcp"});
  }
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = run_broadcast_bench(bo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcast-bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  weightcast::launcher::tune_malloc_for_updates();  // launcher/malloc_tuning.h
  CLI::App app{"weightcast-bench: broadcast and weight-update benchmarks"};
  app.require_subcommand(1);
  int ranks = 3;
  int max_seconds = 1800;
  BroadcastBenchOptions bo;
  bo.backends = split_csv(default_backends());
  HostsBenchOptions ho;
  HostsWorkerOptions wo;
  UpdateBenchOptions uo;
  CodecBenchOptions co;
  RequestsBenchOptions ro;
  auto* cd = add_codec(app, co);
  auto* rq = add_requests(app, ro);
  auto* bc = add_broadcast(app, bo, ranks);
  auto* hs = add_hosts(app, ho);
  auto* hw = add_hosts_worker(app, wo);
  auto* na = add_netns_agent(app);
  auto* up = add_update(app, uo);
  ranged(app, "--max-seconds", max_seconds, "abort the whole run after this long", 1, 86400);
  try {
    app.parse(argc, argv);
    if (bo.min_bytes == 0 || bo.min_bytes > bo.max_bytes) {
      throw std::invalid_argument("--min-bytes must be > 0 and <= --max-bytes");
    }
    if (bo.chunk_bytes == 0) throw std::invalid_argument("--chunk-bytes must be > 0");
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcast-bench: %s\n", e.what());
    return 2;
  }
  signal(SIGALRM, on_alarm);
  alarm(static_cast<unsigned>(max_seconds));
  try {
    if (hw->parsed()) return run_hosts_worker(wo);
    if (na->parsed()) return run_netns_agent(na->remaining());
    if (up->parsed()) return run_update_bench(uo, self_path(argv[0]));
    if (cd->parsed()) return run_codec_bench(co);
    if (rq->parsed()) return run_requests_bench(ro);
    if (hs->parsed()) return run_hosts_bench(ho, self_path(argv[0]));
    if (bc->parsed()) return run_broadcast_mode(argc, argv, ranks, bo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcast-bench: %s\n", e.what());
    return 1;
  }
  return 2;
}
