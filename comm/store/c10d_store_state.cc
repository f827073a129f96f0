#include "comm/store/c10d_store_state.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "comm/errors.h"
#include "comm/store/counter.h"

namespace weightcast::comm {

void C10dStoreState::changed() {
  cv_.notify_all();
  for (int fd : watchers_) {
    const eventfd_t one = 1;
    // Non-blocking and saturating: a pending wake-up is as good as several.
    (void)::write(fd, &one, sizeof(one));
  }
}

void C10dStoreState::charge(const std::string& key, std::size_t new_bytes) {
  auto it = data_.find(key);
  quota_.charge(key, it == data_.end() ? std::nullopt : std::optional(it->second.size()),
                new_bytes);
}

void C10dStoreState::set(const std::string& key, std::string value) {
  std::lock_guard lock(mu_);
  charge(key, value.size());
  data_.insert_or_assign(key, std::move(value));
  changed();
}

std::string C10dStoreState::compare_set(const std::string& key, const std::string& expected,
                                        std::string desired) {
  std::lock_guard lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;  // torch "lies" here; clients rely on it
    quota_.charge(key, std::nullopt, desired.size());
    it = data_.emplace(key, std::move(desired)).first;
    changed();
    return it->second;
  }
  if (it->second == expected) {
    quota_.charge(key, it->second.size(), desired.size());
    it->second = std::move(desired);
    changed();
  }
  return it->second;
}

std::optional<std::string> C10dStoreState::get(const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

std::int64_t C10dStoreState::add(const std::string& key, std::int64_t delta) {
  std::lock_guard lock(mu_);
  auto it = data_.find(key);
  std::int64_t value = it == data_.end() ? 0 : decode_counter(key, it->second);
  value = add_counter(key, value, delta);
  std::string text = encode_counter(value);
  charge(key, text.size());
  data_.insert_or_assign(key, std::move(text));
  changed();
  return value;
}

void C10dStoreState::append(const std::string& key, const std::string& value) {
  std::lock_guard lock(mu_);
  auto it = data_.find(key);
  const std::size_t now = it == data_.end() ? 0 : it->second.size();
  if (value.size() > max_value_bytes_ - std::min(now, max_value_bytes_)) {
    throw StoreFullError(detail::concat("APPEND of ", value.size(), " bytes to a value of ", now,
                                         " bytes would pass the value cap of ", max_value_bytes_));
  }
  charge(key, now + value.size());
  data_[key].append(value);
  changed();
}

bool C10dStoreState::erase(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  quota_.release(key, it->second.size());
  data_.erase(it);
  return true;
}

bool C10dStoreState::has_all(const std::vector<std::string>& keys) const {
  std::lock_guard lock(mu_);
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k); });
}

std::int64_t C10dStoreState::size() const {
  std::lock_guard lock(mu_);
  return static_cast<std::int64_t>(data_.size());
}

std::vector<std::string> C10dStoreState::keys() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  out.reserve(data_.size());
  for (const auto& [k, v] : data_) out.push_back(k);
  return out;
}

std::size_t C10dStoreState::bytes() const {
  std::lock_guard lock(mu_);
  return quota_.bytes();
}

bool C10dStoreState::watch_unless_ready(const std::vector<std::string>& keys, int event_fd) {
  std::lock_guard lock(mu_);
  if (std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k); })) {
    return true;
  }
  watchers_.insert(event_fd);
  return false;
}

void C10dStoreState::unwatch(int event_fd) {
  std::lock_guard lock(mu_);
  watchers_.erase(event_fd);
}

std::int64_t C10dStoreState::counter_or_zero(const std::string& key) const {
  auto it = data_.find(key);
  if (it == data_.end()) return 0;
  std::int64_t v = 0;
  const auto& text = it->second;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && end == text.data() + text.size() ? v : 0;
}

std::int64_t C10dStoreState::wait_counter(const std::string& key, std::int64_t target,
                                          Deadline deadline) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return stopping_ || counter_or_zero(key) >= target; });
  return counter_or_zero(key);
}

void C10dStoreState::stop() {
  std::lock_guard lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

}  // namespace weightcast::comm
