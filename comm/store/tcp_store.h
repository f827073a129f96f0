// Network Store over TCP: TcpStoreServer (hosted by a group's source) and TcpStore (the client
// every other rank uses). The server binds the configured address (default loopback) and an
// ephemeral port that it keeps for its lifetime (never bind-0-then-close), so the port it reports
// is the port it serves. With a token configured, each connection must present it first; the
// comparison is constant-time, and a refused client gets ConfigError("store token refused").
// Keys are bounded by Store::kMaxKeyBytes and values by max_value_bytes; frames over the limits
// are refused before any allocation and the connection is dropped.
//
// Lifetime: the server runs a background acceptor until stop() or destruction, which closes every
// connection and wakes blocked clients (they see PeerError). Threading: both classes are
// thread-safe; a client serializes its calls over one connection, so a get/wait blocked in one
// thread delays other threads' calls on the same client (each still bounded by its own timeout):
// give a thread that must set while another waits its own client. After a TimeoutError the client
// stays usable (it reconnects if the timeout left its connection mid-frame); a lost server gives
// PeerError.
//
// The wire protocol is documented in comm/store/store_protocol.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/store.h"
#include "comm/store/store_client_options.h"
#include "comm/store/store_server_base.h"

namespace weightcast::comm {

struct TcpStoreServerOptions {
  std::string bind_address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: ephemeral
  std::string token;       // empty: no authentication
  std::size_t max_value_bytes = Store::kDefaultMaxValueBytes;
  std::size_t max_connections = 512;
  Millis io_timeout{30000};  // a silent half-sent frame is dropped after this
  // What clients can make the server hold (docs/security.md): a SET or ADD past either cap is
  // answered TOO_LARGE ("store full: ..."), the connection dropped and the refusal logged with its
  // peer; the client sees BadRequestError.
  std::size_t max_store_bytes = 256u << 20;  // keys + values + 128 B a key, all keys together
  std::size_t max_keys = 64u << 10;
};

// Counters since construction, for tests and diagnostics.
struct TcpStoreServerStats {
  std::uint64_t accepted = 0;         // connections taken into service
  std::uint64_t refused = 0;          // connections turned away at max_connections
  std::uint64_t active = 0;           // connections being served now
  std::uint64_t rejected_frames = 0;  // malformed or oversized frames (connection dropped)
  std::uint64_t auth_failures = 0;    // missing or wrong token (connection dropped)
  std::uint64_t dropped_stalled = 0;  // half-sent frames dropped after io_timeout
  std::uint64_t dropped_over_cap = 0;  // SET/ADD refused by max_store_bytes or max_keys
};

// port(), host() and stop() (idempotent) are StoreServerBase's.
class TcpStoreServer : public StoreServerBase {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions opts);  // binds and listens, or ConfigError
  ~TcpStoreServer();

  TcpStoreServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreOptions : StoreClientOptions {
  std::string token;
  std::size_t max_value_bytes = Store::kDefaultMaxValueBytes;
};

class TcpStore final : public Store {
 public:
  // Connects (retrying until connect_timeout) and authenticates.
  explicit TcpStore(TcpStoreOptions opts);
  ~TcpStore() override;

  void set(const std::string& key, std::string_view value, Millis timeout) override;
  std::string get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta, Millis timeout) override;
  bool check(const std::string& key, Millis timeout) override;
  std::size_t max_value_bytes() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcast::comm
