#include "comm/gloo/gloo_store_adapter.h"

#include <string_view>

#include "comm/errors.h"

namespace weightcast::comm::gloo_backend {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<comm::Store> store, Millis timeout,
                                   std::string who)
    : store_(std::move(store)),
      timeout_(timeout),
      deadline_(deadline_after(timeout)),
      who_(std::move(who)) {}

Millis GlooStoreAdapter::budget(Millis requested) const {
  Millis left = remaining(deadline_);
  if (requested.count() > 0 && requested < left) left = requested;
  return std::max(left, Millis(1));
}

void GlooStoreAdapter::rethrow_timeout(const std::vector<std::string>& keys,
                                       const std::exception& e) const {
  std::string names;
  for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
  throw TimeoutError(detail::concat("gloo rendezvous of ", who_, " did not complete within ",
                                    timeout_.count(), " ms: still waiting for key(s) [", names,
                                    "] (Gloo publishes one key per rank); ", e.what()));
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, std::string_view(data.data(), data.size()), budget(timeout_));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  std::string value;
  try {
    value = store_->get(key, budget(timeout_));
  } catch (const TimeoutError& e) {
    rethrow_timeout({key}, e);
  }
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  try {
    store_->wait(keys, budget(timeout));
  } catch (const TimeoutError& e) {
    rethrow_timeout(keys, e);
  }
}

}  // namespace weightcast::comm::gloo_backend
