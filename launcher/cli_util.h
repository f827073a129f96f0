// Small parsing helpers shared by the launchers (argument wiring only).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weightcast::launcher {

// "4096", "64K", "1M", "2G", "512MiB" -> bytes (binary units). Throws std::invalid_argument
// naming the text on anything else or on overflow.
std::uint64_t parse_bytes(const std::string& text);

// 1536 -> "1.5 KiB" style, for headers and progress lines.
std::string format_bytes(std::uint64_t bytes);

// `text` cut at every character of `separators` ("a|b c", "| " -> {"a","b","c"}); empty items
// are dropped.
std::vector<std::string> split_any(const std::string& text, std::string_view separators);

// "a,b,c" -> {"a","b","c"}; empty items are dropped.
std::vector<std::string> split_csv(const std::string& text);

// A child's command line: `argv`, then each flag of `flags` followed by its value; a flag whose
// value is empty is left out.
using FlagValues = std::vector<std::pair<std::string, std::string>>;
std::vector<std::string> with_flags(std::vector<std::string> argv, const FlagValues& flags);

}  // namespace weightcast::launcher
