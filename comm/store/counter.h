// Encoding of Store::add counters: the decimal text of the value, so counters read the same
// through get() on every implementation and over the wire.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>

#include "comm/errors.h"

namespace weightcast::comm {

inline std::string encode_counter(std::int64_t v) {
  return std::to_string(v);
}

inline std::int64_t decode_counter(const std::string& key, const std::string& text) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw BadRequestError("store key '" + key + "' holds a value that is not a counter");
  }
  return v;
}

// current + delta, refusing signed overflow (undefined behaviour, and a delta can come off the
// wire) with BadRequestError instead of wrapping.
inline std::int64_t add_counter(const std::string& key, std::int64_t current, std::int64_t delta) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(current, delta, &out)) {
    throw BadRequestError("store counter '" + key + "' would overflow");
  }
  return out;
}

}  // namespace weightcast::comm
