// PrefixStore: scopes every key of a wrapped Store under "<prefix>/", so several groups
// (one per PP stage, one per init) can share one store server without colliding.
// Lifetime: keeps the wrapped store alive. Threading: as thread-safe as the wrapped store.
#pragma once

#include "comm/store.h"

namespace weightcast::comm {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, std::string_view value, Millis timeout) override;
  std::string get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta, Millis timeout) override;
  bool check(const std::string& key, Millis timeout) override;
  std::size_t max_value_bytes() const override { return inner_->max_value_bytes(); }

  const std::string& prefix() const { return prefix_; }

 private:
  // The caller's key is checked on its own: an empty key would otherwise become "<prefix>/" and
  // pass the wrapped store's check. The prefix counts against kMaxKeyBytes there.
  std::string scoped(const std::string& key) const {
    check_key(key);
    return prefix_ + "/" + key;
  }

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace weightcast::comm
