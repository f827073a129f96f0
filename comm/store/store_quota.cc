#include "comm/store/store_quota.h"

#include "comm/errors.h"

namespace weightcast::comm {

namespace {

std::size_t cost(std::string_view key, std::size_t value_bytes) {
  return key.size() + value_bytes + StoreQuota::kEntryOverhead;
}

}  // namespace

StoreQuota::StoreQuota(std::size_t max_bytes, std::size_t max_keys)
    : max_bytes_(max_bytes), max_keys_(max_keys) {
  if (max_bytes == 0 || max_keys == 0) throw ConfigError("store caps must be positive");
}

void StoreQuota::charge(std::string_view key, std::optional<std::size_t> old_value_bytes,
                        std::size_t new_value_bytes) {
  const std::size_t keys = keys_ + (old_value_bytes ? 0 : 1);
  if (keys > max_keys_) {
    throw StoreFullError(
        detail::concat("store full: a new key would pass the cap of ", max_keys_, " keys"));
  }
  const std::size_t freed = old_value_bytes ? cost(key, *old_value_bytes) : 0;
  const std::size_t bytes = bytes_ - freed + cost(key, new_value_bytes);
  if (bytes > max_bytes_) {
    throw StoreFullError(detail::concat("store full: ", new_value_bytes,
                                         " value bytes would take the store to ", bytes,
                                         " bytes, past its cap of ", max_bytes_));
  }
  keys_ = keys;
  bytes_ = bytes;
}

void StoreQuota::release(std::string_view key, std::size_t value_bytes) {
  bytes_ -= cost(key, value_bytes);
  --keys_;
}

}  // namespace weightcast::comm
