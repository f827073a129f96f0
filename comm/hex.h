// Lower-case hex text of bytes and back: tokens, handles and digests in messages and on the wire.
// Threading: pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace weightcast::comm {

inline std::string to_hex(std::span<const unsigned char> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

// Fills `out` from exactly 2 * out.size() hex digits (either case); false, leaving `out`
// partly written, for any other text.
inline bool from_hex(std::string_view hex, std::span<unsigned char> out) {
  auto value = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() != 2 * out.size()) return false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = value(hex[2 * i]);
    const int lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

}  // namespace weightcast::comm
