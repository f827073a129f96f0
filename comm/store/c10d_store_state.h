// C10dStoreState: the data of a C10dStoreServer (internal to comm/store): keys and values with
// torch's semantics (ADD counters as ASCII decimal, COMPARE_SET as TCPStore's server does it),
// plus the wake-ups that let connection threads answer WAIT asynchronously.
//
// A connection thread with a WAIT outstanding registers an eventfd through watch_unless_ready();
// every later change writes to each registered eventfd, and the thread rechecks its waits. Writing
// to an eventfd never blocks, so a connection that stopped reading cannot hold up a setter.
// Every change is charged to a StoreQuota first: past the store's byte or key cap, or an APPEND
// past max_value_bytes, the change is refused with BadRequestError and nothing is stored (the
// server then drops the connection that asked).
//
// Lifetime: owned by the server. Threading: every member is safe to call from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/store/store_quota.h"

namespace weightcast::comm {

class C10dStoreState {
 public:
  C10dStoreState(std::size_t max_bytes, std::size_t max_keys, std::size_t max_value_bytes)
      : quota_(max_bytes, max_keys), max_value_bytes_(max_value_bytes) {}

  void set(const std::string& key, std::string value);
  // torch's COMPARE_SET: a missing key is created only when `expected` is empty (the reply is then
  // `desired`), else nothing is stored and `expected` comes back; a present key is swapped when it
  // equals `expected`. Returns the reply (the value now, as torch reports it).
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);
  std::optional<std::string> get(const std::string& key) const;
  // Adds to the decimal counter at `key` (absent = 0). BadRequestError for a value that is not a
  // counter or a sum that overflows (torch's std::stoll would throw too: the connection drops).
  std::int64_t add(const std::string& key, std::int64_t delta);
  // BadRequestError when the value would grow past max_value_bytes.
  void append(const std::string& key, const std::string& value);
  bool erase(const std::string& key);
  bool has_all(const std::vector<std::string>& keys) const;
  std::int64_t size() const;
  std::vector<std::string> keys() const;
  std::size_t bytes() const;  // what the quota counts: keys, values and per-key overhead

  // True when every key is present now; otherwise registers `event_fd` to be signalled on every
  // later change (atomically with the check, so no change is missed).
  bool watch_unless_ready(const std::vector<std::string>& keys, int event_fd);
  void unwatch(int event_fd);

  // Waits until the decimal counter at `key` is at least `target`, the deadline passes or stop()
  // is called; returns the last value seen (0 when absent or not a counter).
  std::int64_t wait_counter(const std::string& key, std::int64_t target, Deadline deadline);
  void stop();

 private:
  void changed();                                              // with mu_ held
  std::int64_t counter_or_zero(const std::string& key) const;  // with mu_ held
  // Charges `key` going to `new_bytes` of value (throws past a cap); with mu_ held.
  void charge(const std::string& key, std::size_t new_bytes);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string, std::less<>> data_;
  StoreQuota quota_;
  const std::size_t max_value_bytes_;
  std::set<int> watchers_;
  bool stopping_ = false;
};

}  // namespace weightcast::comm
