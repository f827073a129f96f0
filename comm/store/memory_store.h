// MemoryStore: an in-process Store for ranks-as-threads tests and single-process tools.
// Lifetime: shared by the threads that rendezvous through it. Threading: fully thread-safe;
// blocked get/wait calls wake on set/add and honour their timeouts.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/store.h"

namespace weightcast::comm {

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::size_t max_value_bytes = kDefaultMaxValueBytes)
      : max_value_(max_value_bytes) {}

  void set(const std::string& key, std::string_view value, Millis timeout) override;
  std::string get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta, Millis timeout) override;
  bool check(const std::string& key, Millis timeout) override;
  std::size_t max_value_bytes() const override { return max_value_; }

 private:
  std::size_t max_value_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string, std::less<>> data_;
};

}  // namespace weightcast::comm
