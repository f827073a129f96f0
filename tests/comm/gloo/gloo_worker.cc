// gloo_worker: one rank of the multi-process Gloo tests (started by gloo_process_test).
//
// Usage:
//   gloo_worker --store-host 127.0.0.1 --store-port P --prefix G --rank R --size N --root 0
//               --bytes B --timeout-ms T [--chunk-bytes C] [--chunks-in-flight K]
//               [--progress] [--stop-at-bytes S] [--single-copy 0|1]
// Connects to the store, forms the group, broadcasts a deterministic pattern from the root and
// checks it. Prints, one per line: "joined", "path single-copy" or "path sockets" (whether the
// group agreed on same-host single copy), "broadcasting", "progress <bytes>" (receivers with
// --progress, as the contiguous received prefix grows), "stopping <bytes>" (with
// --stop-at-bytes: it then SIGSTOPs itself mid-transfer so a test can kill it there), and finally
// "ok" or "error <Type>: <message>".
// Exit codes: 0 ok, 2 TimeoutError, 3 PeerError, 4 other error, 5 wrong bytes, 1 bad usage.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "comm/errors.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"

namespace {

using namespace weightcast::comm;

struct Args {
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 0;
  std::string prefix = "gloo-worker";
  int rank = -1;
  int size = 0;
  int root = 0;
  std::size_t bytes = 0;
  long timeout_ms = 10000;
  std::size_t chunk_bytes = 1u << 20;
  int chunks_in_flight = 4;
  bool progress = false;
  std::size_t stop_at_bytes = 0;
  bool single_copy = true;
};

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// The pattern repeats with a prime period, so it never lines up with chunk boundaries, and it is
// never zero, so a receiver's zero-filled buffer never matches it by accident.
constexpr std::size_t kPeriod = 4093;

const std::array<std::uint8_t, kPeriod>& pattern_table() {
  static const auto table = [] {
    std::array<std::uint8_t, kPeriod> t{};
    for (std::size_t i = 0; i < kPeriod; ++i) {
      std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
      x ^= x >> 29;
      t[i] = static_cast<std::uint8_t>(1 + x % 255);
    }
    return t;
  }();
  return table;
}

std::uint8_t pattern_at(std::size_t i) {
  return pattern_table()[i % kPeriod];
}

void fill_pattern(std::uint8_t* data, std::size_t n) {
  for (std::size_t off = 0; off < n; off += kPeriod) {
    std::memcpy(data + off, pattern_table().data(), std::min(kPeriod, n - off));
  }
}

// Offset of the first byte that differs from the pattern, or n.
std::size_t check_pattern(const std::uint8_t* data, std::size_t n) {
  for (std::size_t off = 0; off < n; off += kPeriod) {
    const std::size_t len = std::min(kPeriod, n - off);
    if (std::memcmp(data + off, pattern_table().data(), len) != 0) {
      for (std::size_t i = 0; i < len; ++i) {
        if (data[off + i] != pattern_at(off + i)) return off + i;
      }
    }
  }
  return n;
}

// Watches the receive buffer from a second thread: the length of the prefix whose chunk-final
// bytes already hold the pattern. Gloo fills chunks in order, so this tracks the transfer.
class ProgressMonitor {
 public:
  ProgressMonitor(std::uint8_t* data, const Args& a) : data_(data), a_(a) {
    thread_ = std::thread([this] { run(); });
  }
  ~ProgressMonitor() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::size_t received_prefix(std::size_t from) const {
    std::size_t end = from;
    while (end < a_.bytes) {
      const std::size_t next = std::min(end + a_.chunk_bytes, a_.bytes);
      std::atomic_ref<std::uint8_t> last(data_[next - 1]);
      if (last.load(std::memory_order_relaxed) != pattern_at(next - 1)) break;
      end = next;
    }
    return end;
  }

  void run() {
    std::size_t seen = 0;
    while (!done_.load() && seen < a_.bytes) {
      const std::size_t now = received_prefix(seen);
      if (now != seen) {
        seen = now;
        say("progress " + std::to_string(seen));
        if (a_.stop_at_bytes > 0 && seen >= a_.stop_at_bytes && seen < a_.bytes) {
          say("stopping " + std::to_string(seen));
          ::kill(::getpid(), SIGSTOP);  // the whole process freezes here, mid-transfer
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }

  std::uint8_t* data_;
  const Args& a_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

int run(const Args& a) {
  const Millis timeout(a.timeout_ms);
  // Receivers' pages stay untouched (zero) until data lands; only the root writes the pattern.
  std::unique_ptr<std::uint8_t[], decltype(&std::free)> buf(
      static_cast<std::uint8_t*>(std::calloc(a.bytes == 0 ? 1 : a.bytes, 1)), &std::free);
  if (!buf) throw ConfigError("cannot allocate " + std::to_string(a.bytes) + " bytes");
  if (a.rank == a.root) fill_pattern(buf.get(), a.bytes);

  TcpStoreOptions so;
  so.host = a.store_host;
  so.port = a.store_port;
  so.connect_timeout = timeout;
  CommOptions o =
      member_options(std::make_shared<PrefixStore>(a.prefix, std::make_shared<TcpStore>(so)),
                     a.rank, a.size, timeout);
  o.gloo.chain.chunk_bytes = a.chunk_bytes;
  o.gloo.chain.chunks_in_flight = a.chunks_in_flight;
  o.gloo.single_copy.enabled = a.single_copy;
  auto comm = create_gloo_communicator(o);
  say("joined");
  say(comm->single_copy() ? "path single-copy" : "path sockets");

  BroadcastOptions b;
  b.buffer = buf.get();
  b.bytes = a.bytes;
  b.root = a.root;
  {
    std::unique_ptr<ProgressMonitor> monitor;
    const bool watch = a.progress || a.stop_at_bytes > 0;
    if (watch && a.rank != a.root) monitor = std::make_unique<ProgressMonitor>(buf.get(), a);
    say("broadcasting");
    comm->broadcast(b);
  }
  if (const std::size_t bad = check_pattern(buf.get(), a.bytes); bad != a.bytes) {
    say("mismatch at byte " + std::to_string(bad));
    return 5;
  }
  say("ok");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app("one rank of the multi-process gloo tests");
  app.add_option("--store-host", a.store_host);
  app.add_option("--store-port", a.store_port)->required();
  app.add_option("--prefix", a.prefix);
  app.add_option("--rank", a.rank)->required();
  app.add_option("--size", a.size)->required();
  app.add_option("--root", a.root);
  app.add_option("--bytes", a.bytes)->required();
  app.add_option("--timeout-ms", a.timeout_ms);
  app.add_option("--chunk-bytes", a.chunk_bytes);
  app.add_option("--chunks-in-flight", a.chunks_in_flight);
  app.add_flag("--progress", a.progress);
  app.add_option("--stop-at-bytes", a.stop_at_bytes);
  app.add_option("--single-copy", a.single_copy);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const TimeoutError& e) {
    say(std::string("error TimeoutError: ") + e.what());
    return 2;
  } catch (const PeerError& e) {
    say(std::string("error PeerError: ") + e.what());
    return 3;
  } catch (const std::exception& e) {
    say(std::string("error Error: ") + e.what());
    return 4;
  }
}
