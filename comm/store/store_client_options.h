// StoreClientOptions: where a store client connects and for how long it keeps trying, the part
// both clients' options share (TcpStoreOptions in comm/store/tcp_store.h, C10dStoreOptions in
// comm/store/c10d_store.h derive from it and add their protocol's own fields).
//
// Lifetime/threading: a plain value.
#pragma once

#include <cstdint>
#include <string>

#include "comm/store.h"

namespace weightcast::comm {

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // Connecting retries until this passes (the server may not be up yet), then TimeoutError.
  Millis connect_timeout{30000};
};

}  // namespace weightcast::comm
