#include "comm/store/memory_store.h"

#include <cstring>

#include "comm/errors.h"
#include "comm/store/counter.h"

namespace weightcast::comm {

void check_key(const std::string& key) {
  WC_ENFORCE(!key.empty(), "store key must not be empty");
  WC_ENFORCE_LE(key.size(), Store::kMaxKeyBytes, "store key too long");
}

void check_value(std::string_view value, std::size_t max_value) {
  if (value.size() > max_value) {
    throw BadRequestError(detail::concat("store value of ", value.size(),
                                         " bytes exceeds the limit of ", max_value, " bytes"));
  }
}

void MemoryStore::set(const std::string& key, std::string_view value, Millis /*timeout*/) {
  check_key(key);
  check_value(value, max_value_);
  {
    std::lock_guard lock(mu_);
    data_[key] = std::string(value);
  }
  cv_.notify_all();
}

std::string MemoryStore::get(const std::string& key, Millis timeout) {
  wait({key}, timeout);
  std::lock_guard lock(mu_);
  return data_.at(key);
}

void MemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  for (const auto& k : keys) check_key(k);
  const auto deadline = deadline_after(timeout);
  std::unique_lock lock(mu_);
  auto missing = [&] {
    std::string names;
    for (const auto& k : keys) {
      if (!data_.count(k)) names += (names.empty() ? "" : ", ") + k;
    }
    return names;
  };
  while (true) {
    auto names = missing();
    if (names.empty()) return;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !missing().empty()) {
      throw TimeoutError(detail::concat("store wait timed out after ", timeout.count(),
                                        " ms; missing keys: ", missing()));
    }
  }
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta, Millis /*timeout*/) {
  check_key(key);
  std::int64_t value = 0;
  {
    std::lock_guard lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) value = decode_counter(key, it->second);
    value = add_counter(key, value, delta);
    data_[key] = encode_counter(value);
  }
  cv_.notify_all();
  return value;
}

bool MemoryStore::check(const std::string& key, Millis /*timeout*/) {
  check_key(key);
  std::lock_guard lock(mu_);
  return data_.count(key) != 0;
}

}  // namespace weightcast::comm
