// StoreQuota: the bytes and keys a store server holds, against its caps (internal to comm/store).
// Both store servers charge every change of a key's value here before making it, so no peer can
// make a server grow past max_bytes or max_keys; the refusal is a BadRequestError naming the cap.
// A key costs its key bytes, its value bytes and kEntryOverhead for the map node around them.
// Lifetime: owned by the server's data. Threading: none; the owner calls it under its data lock.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "comm/errors.h"

namespace weightcast::comm {

// A change refused by a store's cap (bytes, keys, a value's size): the request was well formed.
class StoreFullError : public BadRequestError {
 public:
  using BadRequestError::BadRequestError;
};

class StoreQuota {
 public:
  // What a map node, its key and value headers cost beyond the bytes themselves (close to
  // std::map<std::string, std::string> on 64-bit libstdc++).
  static constexpr std::size_t kEntryOverhead = 128;

  StoreQuota(std::size_t max_bytes, std::size_t max_keys);

  // Records that `key` goes from `old_value_bytes` (nullopt: absent) to `new_value_bytes`, or
  // throws StoreFullError when that would pass max_bytes or max_keys (nothing is recorded then).
  void charge(std::string_view key, std::optional<std::size_t> old_value_bytes,
              std::size_t new_value_bytes);
  // Records that `key`, holding `value_bytes`, was erased.
  void release(std::string_view key, std::size_t value_bytes);

  std::size_t bytes() const { return bytes_; }
  std::size_t keys() const { return keys_; }

 private:
  std::size_t max_bytes_;
  std::size_t max_keys_;
  std::size_t bytes_ = 0;
  std::size_t keys_ = 0;
};

}  // namespace weightcast::comm
