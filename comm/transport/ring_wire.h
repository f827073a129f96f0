// What the eager ring's two broadcast protocols (comm/algorithms/eager_ring.h,
// comm/transport/single_copy.h) share: little-endian integer fields written and read byte by byte,
// so the wire format does not depend on the host's byte order or on struct layout; the header that
// opens every broadcast; and the bounded wait on the ring's sockets.
#pragma once

#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "comm/deadline.h"
#include "comm/errors.h"
#include "comm/transport/link_failure.h"

namespace weightcast::comm::gloo_backend {

inline void put_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

inline std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

using RingMagic = std::array<char, 8>;

// What opens every broadcast on the ring, in 32 bytes: a magic naming the message, the
// collective's sequence number (u64), the root (u32), zero (u32) and the byte count (u64).
struct RingHeader {
  static constexpr std::size_t kBytes = 32;
  std::uint64_t sequence = 0;
  std::uint32_t root = 0;
  std::uint64_t bytes = 0;

  void encode(std::uint8_t* out, const RingMagic& magic) const {
    std::memcpy(out, magic.data(), magic.size());
    put_le(out + 8, sequence, 8);
    put_le(out + 16, root, 4);
    put_le(out + 20, 0, 4);
    put_le(out + 24, bytes, 8);
  }
  // False when the magic or the reserved word is wrong (not this message).
  bool decode(const std::uint8_t* in, const RingMagic& magic) {
    if (std::memcmp(in, magic.data(), magic.size()) != 0 || get_le(in + 20, 4) != 0) return false;
    sequence = get_le(in + 8, 8);
    root = static_cast<std::uint32_t>(get_le(in + 16, 4));
    bytes = get_le(in + 24, 8);
    return true;
  }
  bool operator==(const RingHeader&) const = default;

  std::string describe() const {
    return detail::concat(bytes, " bytes from root ", root, " (collective #", sequence, ")");
  }
  // Why a header `got` from rank `pred` is refused by a rank that expects this one.
  std::string refuse(int pred, const RingHeader& got) const {
    return detail::concat("rank ", pred, " sends ", got.describe(), ", this rank expects ",
                          describe(), "; every rank must make the same calls");
  }
};

// Waits until one of fds[1..] is ready. fds[0] is the ring's wake fd: once readable, the wait
// throws WaitInterrupted. Returns 0 when ready, ETIMEDOUT once `deadline` passed, or poll's errno.
inline int wait_ring(std::span<pollfd> fds, Deadline deadline) {
  while (true) {
    if (expired(deadline)) return ETIMEDOUT;
    const auto left = std::min<long long>(remaining(deadline).count() + 1, 60'000);
    const int r = ::poll(fds.data(), static_cast<nfds_t>(fds.size()), static_cast<int>(left));
    if (r < 0 && errno != EINTR) return errno;
    if (r <= 0) continue;
    if (fds[0].revents != 0) throw WaitInterrupted{};
    return 0;
  }
}

}  // namespace weightcast::comm::gloo_backend
