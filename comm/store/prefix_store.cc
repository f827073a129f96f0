#include "comm/store/prefix_store.h"

#include "comm/errors.h"

namespace weightcast::comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  WC_ENFORCE(inner_ != nullptr, "PrefixStore needs a store to wrap");
  WC_ENFORCE(!prefix_.empty(), "PrefixStore prefix must not be empty");
}

void PrefixStore::set(const std::string& key, std::string_view value, Millis timeout) {
  inner_->set(scoped(key), value, timeout);
}

std::string PrefixStore::get(const std::string& key, Millis timeout) {
  return inner_->get(scoped(key), timeout);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> scoped_keys;
  scoped_keys.reserve(keys.size());
  for (const auto& k : keys) scoped_keys.push_back(scoped(k));
  inner_->wait(scoped_keys, timeout);
}

std::int64_t PrefixStore::add(const std::string& key, std::int64_t delta, Millis timeout) {
  return inner_->add(scoped(key), delta, timeout);
}

bool PrefixStore::check(const std::string& key, Millis timeout) {
  return inner_->check(scoped(key), timeout);
}

}  // namespace weightcast::comm
