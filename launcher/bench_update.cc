#include "launcher/bench_update.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "launcher/cli_util.h"
#include "sync/model.h"
#include "sync/trainer/updater.h"

namespace weightcast::launcher {
namespace {

// A child process whose stdout we read line by line; killed and reaped on destruction.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status;
      waitpid(pid_, &status, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // Next line within `timeout_ms`, or throws naming `what`.
  std::string line(int timeout_ms, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
        throw std::runtime_error(what + ": no output in time");
      }
      char tmp[4096];
      ssize_t n = read(fd_, tmp, sizeof(tmp));
      if (n <= 0) throw std::runtime_error(what + ": exited early");
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }

  int wait_exit() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_;
};

// Peak resident set of a process in bytes (VmHWM), 0 when unreadable.
std::uint64_t peak_rss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      std::uint64_t kib = 0;
      in >> kib;
      return kib << 10;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

// CPU seconds (user + system) a process has used so far, 0 when unreadable.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream fields(text.substr(close_paren + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string sibling(const std::string& self, const std::string& rel) {
  auto slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/" + rel;
}

// The raw data plane: one gloo-chain broadcast of `bytes` from a source to `receivers` processes
// (bench hosts-worker on loopback), seconds per broadcast.
double raw_chain_seconds(const UpdateBenchOptions& o, const std::string& self, std::uint64_t bytes,
                         int receivers) {
  auto args = [&](int rank, int port) {
    return std::vector<std::string>{self,
                                    "hosts-worker",
                                    "--rank",
                                    std::to_string(rank),
                                    "--size",
                                    std::to_string(receivers + 1),
                                    "--bind",
                                    "127.0.0.1",
                                    "--store-host",
                                    "127.0.0.1",
                                    "--store-port",
                                    std::to_string(port),
                                    "--bytes",
                                    std::to_string(bytes),
                                    "--iters",
                                    std::to_string(o.iters),
                                    "--chunk-bytes",
                                    std::to_string(o.chunk_bytes),
                                    "--backends",
                                    "gloo-chain",
                                    "--timeout-ms",
                                    std::to_string(o.timeout_ms)};
  };
  Child root(args(0, 0));
  int port = 0;
  std::sscanf(root.line(o.timeout_ms, "raw broadcast root").c_str(), "store-port %d", &port);
  std::vector<std::unique_ptr<Child>> others;
  for (int r = 1; r <= receivers; ++r) others.push_back(std::make_unique<Child>(args(r, port)));
  char name[64];
  double us = 0;
  unsigned long long wrong = 0;
  if (std::sscanf(root.line(o.timeout_ms, "raw broadcast").c_str(), "result %63s %lf %llu", name,
                  &us, &wrong) != 3 ||
      wrong != 0) {
    throw std::runtime_error("raw broadcast failed or delivered wrong bytes");
  }
  return us * 1e-6;
}

}  // namespace

int run_update_bench(const UpdateBenchOptions& o, const std::string& self) {
  const sync::ModelSpec spec = sync::model_spec_for_bytes(o.model_bytes);
  const auto metas = sync::hf_tensors(spec);
  const std::uint64_t model_bytes = sync::total_bytes(metas);

  char spec_path[] = "/tmp/weightcast-bench-model-XXXXXX";
  const int spec_fd = mkstemp(spec_path);
  if (spec_fd < 0) throw std::runtime_error("cannot create a temporary model file");
  const std::string spec_text = sync::to_json(spec).dump();
  if (write(spec_fd, spec_text.data(), spec_text.size()) !=
      static_cast<ssize_t>(spec_text.size())) {
    throw std::runtime_error("cannot write the temporary model file");
  }
  close(spec_fd);
  struct Unlink {
    const char* p;
    ~Unlink() { unlink(p); }
  } unlink_spec{spec_path};

  const std::string engine_bin = sibling(self, "engine/weightcast-engine");
  std::vector<std::unique_ptr<Child>> engines;
  std::vector<std::string> urls;
  for (int e = 0; e < o.engines; ++e) {
    engines.push_back(std::make_unique<Child>(std::vector<std::string>{
        engine_bin, "--port", "0", "--ranks", std::to_string(o.ranks_per_engine), "--model",
        spec_path, "--seed", "1", "--max-bucket-bytes",
        std::to_string(std::max(o.bucket_bytes, model_bytes)), "--chunk-bytes",
        std::to_string(o.chunk_bytes), "--comm-timeout-ms", std::to_string(o.timeout_ms),
        "--session-timeout-ms", std::to_string(o.timeout_ms)}));
    std::string l = engines.back()->line(o.timeout_ms, "weightcast-engine");
    auto at = l.find("http://");
    if (at == std::string::npos) throw std::runtime_error("engine said: " + l);
    urls.push_back(l.substr(at));
  }

  // The source's weights: the whole model at step k, generated in memory.
  std::vector<std::vector<std::byte>> storage(metas.size());
  std::vector<sync::trainer::NamedTensor> tensors(metas.size());
  for (std::size_t i = 0; i < metas.size(); ++i) storage[i].resize(metas[i].byte_count());

  sync::trainer::UpdaterOptions uo;
  uo.selector = sync::Selector::kTarget;
  uo.buckets.bucket_bytes = o.bucket_bytes;
  uo.buckets.max_in_flight = static_cast<std::size_t>(o.max_in_flight);
  uo.buckets.timeout = comm::Millis(o.timeout_ms);
  uo.request_timeout = comm::Millis(o.timeout_ms);
  uo.group_timeout = comm::Millis(o.timeout_ms);
  // The source's chain chunks must match the engines' --chunk-bytes (checked at group setup).
  uo.communicator_factory = [chunk = o.chunk_bytes](std::string_view backend,
                                                    const comm::CommOptions& options) {
    comm::CommOptions with_chunk = options;
    with_chunk.chunk_bytes = chunk;
    return comm::create_communicator(backend, with_chunk);
  };
  sync::trainer::DistributedUpdater updater(urls, uo);

  std::printf(
      "# weightcast-bench update: %d engines x %d ranks, model %s (%zu tensors), bucket %s,"
      " %d updates, gloo over loopback\n",
      o.engines, o.ranks_per_engine, format_bytes(model_bytes).c_str(), metas.size(),
      format_bytes(o.bucket_bytes).c_str(), o.iters);
  std::printf("%4s %10s %9s %8s %9s %9s %10s %11s %12s\n", "step", "seconds", "GB/s", "buckets",
              "data(s)", "commit(s)", "outside%", "http_wait%", "src_peakRSS");
  std::fflush(stdout);
  double total_s = 0, total_data = 0;
  std::uint64_t buckets = 0;
  int failed = 0;
  for (int step = 1; step <= o.iters; ++step) {
    for (std::size_t i = 0; i < metas.size(); ++i) {
      sync::fill_tensor(metas[i], 1, static_cast<std::uint64_t>(step), storage[i]);
      tensors[i] = {metas[i], storage[i]};
    }
    const auto r = updater.update(tensors);
    if (!r.ok) {
      std::printf("# update %d FAILED: %s\n", step, r.error.c_str());
      ++failed;
      continue;
    }
    // Data plane = the bucket phase less the time spent waiting on HTTP answers and packing.
    const double plane = r.phases.data - r.http_wait_seconds - r.pack_wait_seconds;
    const double outside = 1.0 - plane / r.seconds;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("%4d %10.3f %9.3f %8llu %9.3f %9.3f %9.1f%% %10.1f%% %12s\n", step, r.seconds,
                r.gbps(), static_cast<unsigned long long>(r.buckets), r.phases.data,
                r.phases.commit, 100 * outside, 100 * r.http_wait_seconds / r.seconds,
                format_bytes(static_cast<std::uint64_t>(ru.ru_maxrss) << 10).c_str());
    std::fflush(stdout);
    total_s += r.seconds;
    total_data += r.phases.data;
    buckets = r.buckets;
  }
  const int ok = o.iters - failed;
  const double update_s = ok ? total_s / ok : 0;

  std::printf("# CPU seconds over the run (cores here: %ld): source %.2f",
              sysconf(_SC_NPROCESSORS_ONLN), cpu_seconds(getpid()));
  for (const auto& e : engines) std::printf(", engine %.2f", cpu_seconds(e->pid()));
  std::printf("\n");
  for (std::size_t e = 0; e < engines.size(); ++e) {
    std::printf(
        "# engine %zu peak RSS %s (weights %s, budget weights x 2 + 2 x bucket + 64 MiB = "
        "%s)\n",
        e, format_bytes(peak_rss(engines[e]->pid())).c_str(), format_bytes(model_bytes).c_str(),
        format_bytes(2 * model_bytes + 2 * o.bucket_bytes + (64u << 20)).c_str());
  }
  engines.clear();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("# source peak RSS %s (model %s; budget model + 2 x bucket + 64 MiB = %s)\n",
              format_bytes(static_cast<std::uint64_t>(ru.ru_maxrss) << 10).c_str(),
              format_bytes(model_bytes).c_str(),
              format_bytes(model_bytes + 2 * o.bucket_bytes + (64u << 20)).c_str());

  const double raw_s = raw_chain_seconds(o, self, model_bytes, o.engines * o.ranks_per_engine);
  std::printf("# raw gloo-chain broadcast of the same %s to %d ranks: %.3f s (%.3f GB/s)\n",
              format_bytes(model_bytes).c_str(), o.engines * o.ranks_per_engine, raw_s,
              static_cast<double>(model_bytes) / raw_s / 1e9);
  if (ok) {
    std::printf(
        "# update avg %.3f s (%.3f GB/s), %llu buckets; update / raw broadcast = %.2fx of "
        "raw throughput\n",
        update_s, static_cast<double>(model_bytes) / update_s / 1e9,
        static_cast<unsigned long long>(buckets), raw_s / update_s);
  }
  return failed ? 1 : 0;
}

}  // namespace weightcast::launcher
