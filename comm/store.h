// Store: the rendezvous key-value store ranks use to find each other (Gloo pair addresses, the
// NCCL unique id, readiness counters).
//
// Lifetime: owned through std::shared_ptr; a communicator keeps its store alive while it
// rendezvouses. Threading: every implementation is safe to call from several threads at once.
// Every call that can block takes a timeout and throws TimeoutError when it passes; a network
// store also throws PeerError when its server goes away and ConfigError when the token is refused.
// Keys are at most kMaxKeyBytes bytes; values are bounded per implementation (see max_value_bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/deadline.h"

namespace weightcast::comm {

class Store {
 public:
  static constexpr std::size_t kMaxKeyBytes = 1024;
  static constexpr std::size_t kDefaultMaxValueBytes = 16u << 20;

  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any previous value, and wakes waiters on it.
  virtual void set(const std::string& key, std::string_view value, Millis timeout) = 0;

  // Returns the value of `key`, waiting until it is set or `timeout` passes (TimeoutError).
  virtual std::string get(const std::string& key, Millis timeout) = 0;

  // Waits until every key in `keys` is set, or throws TimeoutError naming the missing ones.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;

  // Atomically adds `delta` to the 64-bit counter at `key` (absent = 0) and returns the new
  // value. A key holding a non-counter value raises BadRequestError.
  virtual std::int64_t add(const std::string& key, std::int64_t delta, Millis timeout) = 0;

  // Returns whether `key` is set now, without waiting (beyond the I/O timeout).
  virtual bool check(const std::string& key, Millis timeout) = 0;

  virtual std::size_t max_value_bytes() const { return kDefaultMaxValueBytes; }
};

// Throws EnforceError unless `key` is non-empty and at most kMaxKeyBytes, and BadRequestError
// when a value exceeds `max_value`. Shared by every implementation so limits read the same.
void check_key(const std::string& key);
void check_value(std::string_view value, std::size_t max_value);

}  // namespace weightcast::comm
