// Little-endian integer fields of the eager ring's messages (comm/gloo/eager_ring.h and
// comm/gloo/single_copy.h): every field is written and read byte by byte, so the wire format does
// not depend on the host's byte order or on struct layout.
#pragma once

#include <cstdint>

namespace weightcast::comm::gloo_backend {

inline void put_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

inline std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace weightcast::comm::gloo_backend
