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
#include <cstdio>
#include <cstdlib>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "launcher/bench_broadcast.h"
#include "launcher/bench_hosts.h"
#include "launcher/bench_update.h"
#include "launcher/cli_util.h"
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

void on_alarm(int) {
  const char msg[] = "weightcast-bench: --max-seconds passed; aborting the run\n";
  (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
  _exit(124);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weightcast-bench: broadcast and weight-update benchmarks"};
  app.require_subcommand(1);
  int ranks = 3;
  int max_seconds = 1800;
  std::string min_bytes = "1M", max_bytes = "1G", chunk = "4M", backends = default_backends();
  BroadcastBenchOptions bo;

  auto* bc = app.add_subcommand("broadcast", "broadcast bandwidth table, ours against peers");
  bc->add_option("--ranks", ranks, "processes to start when not already under mpirun")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  bc->add_option("--backends", backends, "comma list: gloo-chain, gloo-stock, mpi-bcast, nccl")
      ->capture_default_str();
  bc->add_option("--min-bytes", min_bytes, "smallest size (K/M/G suffixes)")->capture_default_str();
  bc->add_option("--max-bytes", max_bytes, "largest size")->capture_default_str();
  bc->add_option("--factor", bo.factor, "size multiplier per row")
      ->check(CLI::Range(2, 16))
      ->capture_default_str();
  bc->add_option("--warmup", bo.warmup, "untimed iterations per row")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  bc->add_option("--iters", bo.iters, "timed iterations per row")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  bc->add_option("--root", bo.root, "broadcast root rank")->capture_default_str();
  bc->add_option("--chunk-bytes", chunk, "gloo-chain chunk size")->capture_default_str();
  bc->add_option("--in-flight", bo.chunks_in_flight, "gloo-chain chunks in flight per link")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  bc->add_option("--bind", bo.bind_address, "address the store and Gloo bind")
      ->capture_default_str();
  bc->add_option("--timeout-ms", bo.timeout_ms, "deadline of every collective")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  add_output_options(*bc, bo.output);
  HostsBenchOptions ho;
  std::string hosts_bytes = "64M", hosts_chunk = "1M";
  auto* hs = app.add_subcommand(
      "hosts", "chain vs stock Gloo between network namespaces with shaped links (needs root)");
  hs->add_option("--receivers", ho.receivers, "receiving hosts")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  hs->add_option("--rate", ho.rate, "tc tbf rate of every host link (kbit/mbit/gbit)")
      ->capture_default_str();
  hs->add_option("--bytes", hosts_bytes, "bytes per broadcast")->capture_default_str();
  hs->add_option("--iters", ho.iters, "timed broadcasts per backend")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  hs->add_option("--chunk-bytes", hosts_chunk, "gloo-chain chunk size")->capture_default_str();
  hs->add_option("--in-flight", ho.chunks_in_flight, "gloo-chain chunks in flight per link")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  add_output_options(*hs, ho.output);
  std::string hosts_update = "0", hosts_update_bucket = "64M";
  hs->add_option("--update-model-bytes", hosts_update,
                 "also time the end-to-end update of a model of this size (0: off)")
      ->capture_default_str();
  hs->add_option("--update-bucket-bytes", hosts_update_bucket, "bucket size of that update")
      ->capture_default_str();

  HostsWorkerOptions wo;
  std::string worker_bytes = "0", worker_chunk = "1M";
  auto* hw = app.add_subcommand("hosts-worker", "one host of the hosts mode (internal)");
  hw->group("");  // not listed in --help
  hw->add_option("--rank", wo.rank)->required();
  hw->add_option("--size", wo.size)->required();
  hw->add_option("--bind", wo.bind_address)->required();
  hw->add_option("--store-host", wo.store_host)->required();
  hw->add_option("--store-port", wo.store_port)->required();
  hw->add_option("--bytes", worker_bytes)->required();
  hw->add_option("--iters", wo.iters);
  hw->add_option("--chunk-bytes", worker_chunk);
  hw->add_option("--in-flight", wo.chunks_in_flight);
  hw->add_option("--timeout-ms", wo.timeout_ms);
  std::string worker_backends = "gloo-chain,gloo-stock";
  hw->add_option("--backends", worker_backends);

  UpdateBenchOptions uo;
  std::string update_bytes = "1G", update_bucket = "256M", update_chunk = "4M";
  auto* up = app.add_subcommand(
      "update",
      "end-to-end update to engine processes vs the raw chain broadcast of the same bytes");
  up->add_option("--engines", uo.engines, "engine processes")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  up->add_option("--ranks", uo.ranks_per_engine, "ranks per engine")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  up->add_option("--model-bytes", update_bytes, "model size (a Qwen-like model of about this size)")
      ->capture_default_str();
  up->add_option("--bucket-bytes", update_bucket, "bucket size")->capture_default_str();
  up->add_option("--chunk-bytes", update_chunk, "gloo-chain chunk size")->capture_default_str();
  up->add_option("--max-in-flight", uo.max_in_flight, "unanswered bucket requests per engine")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  up->add_option("--timeout-ms", uo.timeout_ms, "deadline of each update and broadcast")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  up->add_option("--iters", uo.iters, "updates (and raw broadcasts) to time")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  add_output_options(*up, uo.output);
  std::string engine_urls;
  up->add_option("--engine-urls", engine_urls,
                 "update these running engines (comma list) instead of starting --engines");
  up->add_option("--bind", uo.bind_address, "address the source's store and data plane bind")
      ->capture_default_str();
  up->add_flag("!--no-raw", uo.raw, "skip the raw chain broadcast comparison");

  app.add_option("--max-seconds", max_seconds, "abort the whole run after this long")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);

  try {
    bo.min_bytes = parse_bytes(min_bytes);
    bo.max_bytes = parse_bytes(max_bytes);
    bo.chunk_bytes = parse_bytes(chunk);
    bo.backends = split_csv(backends);
    if (bo.min_bytes == 0 || bo.min_bytes > bo.max_bytes) {
      throw std::invalid_argument("--min-bytes must be > 0 and <= --max-bytes");
    }
    if (bo.chunk_bytes == 0) throw std::invalid_argument("--chunk-bytes must be > 0");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcast-bench: %s\n", e.what());
    return 2;
  }

  signal(SIGALRM, on_alarm);
  alarm(static_cast<unsigned>(max_seconds));
  if (hs->parsed() || hw->parsed() || up->parsed()) {
    try {
      char self_buf[4096];
      ssize_t n = readlink("/proc/self/exe", self_buf, sizeof(self_buf) - 1);
      const std::string self = n > 0 ? std::string(self_buf, static_cast<std::size_t>(n)) : argv[0];
      if (hw->parsed()) {
        wo.bytes = parse_bytes(worker_bytes);
        wo.chunk_bytes = parse_bytes(worker_chunk);
        wo.backends = split_csv(worker_backends);
        return run_hosts_worker(wo);
      }
      if (up->parsed()) {
        uo.model_bytes = parse_bytes(update_bytes);
        uo.bucket_bytes = parse_bytes(update_bucket);
        uo.chunk_bytes = parse_bytes(update_chunk);
        uo.engine_urls = split_csv(engine_urls);
        return run_update_bench(uo, self);
      }
      ho.bytes = parse_bytes(hosts_bytes);
      ho.update_model_bytes = parse_bytes(hosts_update);
      ho.update_bucket_bytes = parse_bytes(hosts_update_bucket);
      ho.chunk_bytes = parse_bytes(hosts_chunk);
      return run_hosts_bench(ho, self);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "weightcast-bench: %s\n", e.what());
      return 1;
    }
  }

  if (!under_mpirun()) {
    try {
      // MPI_Bcast is a peer measured over Open MPI's TCP transport, as ours runs over TCP:
      // shared memory (vader) would compare a different link.
      relaunch_under_mpirun(ranks, std::vector<std::string>(argv, argv + argc), {"btl=self,tcp"});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "weightcast-bench: %s\n", e.what());
      return 2;
    }
  }

  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    if (bc->parsed()) rc = run_broadcast_bench(bo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcast-bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
