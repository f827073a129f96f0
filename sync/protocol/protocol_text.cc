#include "sync/protocol/protocol_text.h"

#include "comm/errors.h"

namespace weightcast::sync {

std::string quoted(std::string_view text) {
  constexpr std::size_t kMaxShown = 64;
  constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > kMaxShown) out += "...";
  out += "'";
  return out;
}

std::size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    // Bounds on the second byte exclude overlong forms, surrogates and code points > U+10FFFF
    // (the table of well-formed sequences in the Unicode standard, section 3.9).
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

void validate_identifier(std::string_view text, std::size_t max_length, std::string_view field) {
  if (text.empty()) throw comm::BadRequestError(std::string(field) + ": must not be empty");
  if (text.size() > max_length) {
    throw comm::BadRequestError(std::string(field) + ": " + std::to_string(text.size()) +
                                " bytes, longer than the limit of " + std::to_string(max_length));
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x21 || c > 0x7e) {
      throw comm::BadRequestError(std::string(field) + ": " + quoted(text) + " has byte " +
                                  std::to_string(i) +
                                  " outside printable ASCII without whitespace");
    }
  }
}

}  // namespace weightcast::sync
