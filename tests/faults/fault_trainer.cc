// weightcast_fault_trainer: a trainer as a process of its own, for tests that kill the trainer.
//
//   weightcast_fault_trainer --engines http://127.0.0.1:4001,http://127.0.0.1:4002 --steps 3
//       [--bucket-bytes 262144] [--bucket-delay-ms 80] [--data-timeout-ms 6000]
//       [--group-timeout-ms 6000] [--request-timeout-ms 1500]
//
// Runs --steps updates with a DistributedUpdater (selector target), each sending the weights of
// the version it commits (version v = the generator's step v, see fault_support.h), and prints
// one line per update:
//   update 1 ok version 1 selector target tensors 21 bytes ...
//   update 2 FAILED FAILED version 2: <error>
// Exit code: 0 when every update committed, 1 otherwise, 2 on bad arguments.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/faults/fault_support.h"

namespace {

using weightcast::faults::Millis;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = text.find(',', start);
    const auto end = comma == std::string::npos ? text.size() : comma;
    if (end > start) out.push_back(text.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool number(const std::string& text, long& value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size() && value >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> engines;
  long steps = 1;
  weightcast::faults::TrainerConfig config;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    long n = 0;
    if (flag == "--engines") {
      engines = split(value);
      continue;
    }
    if (!number(value, n)) {
      std::fprintf(stderr, "%s: not a number: %s\n", flag.c_str(), value.c_str());
      return 2;
    }
    if (flag == "--steps") {
      steps = n;
    } else if (flag == "--bucket-bytes") {
      config.bucket_bytes = static_cast<std::size_t>(n);
    } else if (flag == "--bucket-delay-ms") {
      config.bucket_delay = Millis(n);
    } else if (flag == "--data-timeout-ms") {
      config.data_timeout = Millis(n);
    } else if (flag == "--group-timeout-ms") {
      config.group_timeout = Millis(n);
    } else if (flag == "--request-timeout-ms") {
      config.request_timeout = Millis(n);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (engines.empty() || argc % 2 == 0) {
    std::fprintf(stderr, "usage: %s --engines URL[,URL...] [--steps N] [...]\n", argv[0]);
    return 2;
  }
  try {
    auto updater = weightcast::faults::make_updater(engines, config);
    bool all_ok = true;
    // The version the next update commits: one past the highest the engines report, then one
    // more per committed update (DistributedUpdater counts the same way).
    std::uint64_t next = 1;
    for (const auto& info : updater->connect()) {
      long v = 0;
      if (number(info.weight_version, v)) next = std::max<std::uint64_t>(next, v + 1);
    }
    for (long step = 1; step <= steps; ++step) {
      const auto report = updater->update(weightcast::faults::views_at(next));
      std::printf("update %lu %s %s\n", static_cast<unsigned long>(next),
                  report.ok ? "ok" : "FAILED", weightcast::sync::trainer::summary(report).c_str());
      std::fflush(stdout);
      all_ok = all_ok && report.ok;
      if (report.ok) ++next;
    }
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightcast_fault_trainer: %s\n", e.what());
    return 1;
  }
}
