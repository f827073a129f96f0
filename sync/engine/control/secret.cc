#include "sync/engine/control/secret.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "comm/errors.h"
#include "comm/hex.h"

namespace weightcast::sync::engine {

std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw comm::ConfigError(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  return comm::to_hex(raw);
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Walk the longer string in full whatever the contents; the length difference is folded into
  // the accumulator so a shorter candidate cannot match a prefix.
  const std::size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff |= static_cast<unsigned>(x ^ y);
  }
  // Keep the compiler from turning the loop into an early-exit comparison.
  volatile unsigned sink = diff;
  return sink == 0;
}

}  // namespace weightcast::sync::engine
