// C10dStoreServer: a torch-compatible c10d TCPStore server (the protocol, keys and security
// notes are in comm/store/c10d_store.h); it serves both protocol generations on one port.
// Lifetime/threading: as TcpStoreServer (comm/store/tcp_store.h): serves until stop() or
// destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/store/store_server_base.h"

namespace weightcast::comm {

struct C10dStoreServerOptions {
  std::string bind_address = "127.0.0.1";
  std::uint16_t port = 0;                  // 0: ephemeral, kept for the server's lifetime
  std::size_t max_key_bytes = 8u << 10;    // torch's libuv backend limit
  std::size_t max_value_bytes = 8u << 20;  // torch's libuv backend limit
  std::size_t max_keys_per_request = 128u << 10;
  std::size_t max_request_bytes = 32u << 20;  // one whole request; bounds a connection's buffer
  std::size_t max_connections = 512;
  Millis io_timeout{30000};  // a silent half-sent request, or replies left untaken, drop after this
  // What peers can make the server hold (docs/security.md). torch's protocol has no error reply,
  // so each refusal drops only the connection that asked, and is logged with its peer.
  std::size_t max_store_bytes = 256u << 20;  // keys + values + 128 B a key, all keys together
  std::size_t max_keys = 64u << 10;
  // A connection is not read while its unsent replies exceed this: the server first sends them
  // (bounded by io_timeout). One reply larger than max_request_bytes (a MULTI_GET naming one big
  // value many times) is refused outright.
  std::size_t max_unsent_reply_bytes = 16u << 20;
  // All connections' buffered requests and unsent replies together, beyond the first 64 KiB of
  // each (which a connection may always hold, so small requests always get through).
  std::size_t max_buffered_bytes = 256u << 20;
};

struct C10dStoreServerStats {
  std::uint64_t accepted = 0;
  std::uint64_t refused = 0;  // over max_connections
  std::uint64_t active = 0;
  std::uint64_t rejected_frames = 0;   // garbage, oversized or unknown query: connection dropped
  std::uint64_t dropped_stalled = 0;   // half-sent requests dropped after io_timeout
  std::uint64_t dropped_over_cap = 0;  // a cap above refused what the connection asked
  std::uint64_t store_bytes = 0;       // what max_store_bytes counts, now
  std::uint64_t buffered_bytes = 0;    // what max_buffered_bytes counts, now
  std::uint64_t torch1_connections = 0;
  std::uint64_t torch2_connections = 0;
};

// port(), host() and stop() (idempotent; closes every connection, blocked waiters see EOF) are
// StoreServerBase's.
class C10dStoreServer : public StoreServerBase {
 public:
  explicit C10dStoreServer(C10dStoreServerOptions opts);  // binds and listens, or ConfigError
  ~C10dStoreServer();

  C10dStoreServerStats stats() const;

  // torch's master behaviour: waits until the "init/" counter reaches `workers` (every rank,
  // the master included, adds itself), or throws TimeoutError naming how many joined.
  void wait_for_workers(std::int64_t workers, Millis timeout);

  // Every key currently stored, as sent on the wire (for tests and diagnostics).
  std::vector<std::string> keys() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcast::comm
