// torch-compatible rendezvous: C10dStoreServer and C10dStore speak the wire protocol of torch's
// c10d TCPStore (torch/csrc/distributed/c10d/TCPStore*.cpp), so torch processes and weightcast
// processes can meet in one store, whichever side hosts it.
//
// Two protocol generations exist (docs/interop.md has the tables and the upstream references):
//   kTorch1  torch 1.x (Debian's 1.13): SET=0 ... DELETE_KEY=8, no handshake.
//   kTorch2  torch 2.x: VALIDATE=0 (u32 magic 0x3C85F7CE, must come first), SET=1 ... PING=13,
//            WAIT answered asynchronously and cancellable (CANCEL_WAIT / WAIT_CANCELED).
// The server serves both on one port: it tells a connection's generation from its first request
// (VALIDATE with the right magic = 2.x, anything else = 1.x). The client is told which to speak,
// or detects it (kAuto).
//
// Keys. Like torch's client, C10dStore sends every user key with a leading "/" (so set("a") is
// "/a" on the wire); torch's internal worker counter "init/" is sent as-is through
// join_as_worker() / C10dStoreServer::wait_for_workers(). Scope group keys with PrefixStore, which
// joins "prefix/key" exactly as torch's PrefixStore does (comm/torch_group.h builds the chains).
//
// Values of ADD counters are ASCII decimal, as in torch, so get() on a counter returns digits.
//
// Security: torch's protocol has no authentication, so neither has this store; it binds the
// configured address only (loopback by default) and bounds every size. Prefer the weightcast
// TcpStore for groups without torch members.
//
// Lifetime/threading: as TcpStoreServer / TcpStore (comm/store/tcp_store.h): the server serves
// until stop() or destruction; the client is thread-safe and serializes calls on one connection;
// every call is bounded by its timeout (TimeoutError), a lost server gives PeerError, and a server
// that answers out of protocol gives PeerError too (the connection is then closed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store.h"
#include "comm/store/store_client_options.h"
#include "comm/store/store_server_base.h"

namespace weightcast::comm {

enum class C10dProtocol { kAuto, kTorch1, kTorch2 };

std::string_view to_string(C10dProtocol protocol);

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
  std::uint64_t rejected_frames = 0;  // garbage, oversized or unknown query: connection dropped
  std::uint64_t dropped_stalled = 0;  // half-sent requests dropped after io_timeout
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

struct C10dStoreOptions : StoreClientOptions {
  C10dProtocol protocol = C10dProtocol::kAuto;
  std::size_t max_value_bytes = 8u << 20;
};

class C10dStore final : public Store {
 public:
  // Connects (retrying until connect_timeout) and, for 2.x, sends VALIDATE and PING.
  explicit C10dStore(C10dStoreOptions opts);
  ~C10dStore() override;

  // The generation in use (resolved when constructed with kAuto).
  C10dProtocol protocol() const;

  // What a torch worker does right after connecting: ADD "init/" 1 (no leading slash).
  std::int64_t join_as_worker(Millis timeout);

  void set(const std::string& key, std::string_view value, Millis timeout) override;
  std::string get(const std::string& key, Millis timeout) override;  // WAIT, then GET, as torch
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta, Millis timeout) override;
  bool check(const std::string& key, Millis timeout) override;
  std::size_t max_value_bytes() const override;

  // The rest of torch's Store API.
  std::string compare_set(const std::string& key, std::string_view expected,
                          std::string_view desired, Millis timeout);
  bool delete_key(const std::string& key, Millis timeout);
  std::int64_t num_keys(Millis timeout);
  // 2.x only (ConfigError on a 1.x connection).
  void append(const std::string& key, std::string_view value, Millis timeout);
  std::vector<std::string> multi_get(const std::vector<std::string>& keys, Millis timeout);
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                 Millis timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcast::comm
