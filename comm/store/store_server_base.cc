// StoreServerBase: the ConnectionServer a store server owns (store_server_base.h).
#include "comm/store/store_server_base.h"

#include "comm/store/connection_server.h"

namespace weightcast::comm {

StoreServerBase::StoreServerBase() = default;
StoreServerBase::~StoreServerBase() = default;

ConnectionServer& StoreServerBase::listen(const ConnectionServerOptions& opts,
                                          std::function<void()> wake) {
  server_ = std::make_unique<ConnectionServer>(opts);
  wake_ = std::move(wake);
  return *server_;
}

std::uint16_t StoreServerBase::port() const {
  return server_->port();
}

const std::string& StoreServerBase::host() const {
  return server_->host();
}

void StoreServerBase::stop() {
  if (server_) server_->stop(wake_);
}

}  // namespace weightcast::comm
