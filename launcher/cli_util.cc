#include "launcher/cli_util.h"

#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace weightcast::launcher {

std::uint64_t parse_bytes(const std::string& text) {
  std::uint64_t value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [p, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || p == begin) {
    throw std::invalid_argument("not a byte count: '" + text + "' (examples: 4096, 64K, 1M, 2G)");
  }
  std::string unit(p, end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    shift = 10;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    shift = 20;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    shift = 30;
  } else {
    throw std::invalid_argument("unknown unit in byte count '" + text + "' (use K, M or G)");
  }
  if (shift > 0 && value > (std::numeric_limits<std::uint64_t>::max() >> shift)) {
    throw std::invalid_argument("byte count overflows: '" + text + "'");
  }
  return value << shift;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  }
  return buf;
}

std::vector<std::string> split_any(const std::string& text, std::string_view separators) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (separators.find(c) != std::string_view::npos) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::vector<std::string> split_csv(const std::string& text) {
  return split_any(text, ",");
}

std::vector<std::string> with_flags(std::vector<std::string> argv, const FlagValues& flags) {
  for (const auto& [flag, value] : flags) {
    if (!value.empty()) argv.insert(argv.end(), {flag, value});
  }
  return argv;
}

}  // namespace weightcast::launcher
