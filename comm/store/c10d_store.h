// torch-compatible rendezvous: C10dStoreServer (comm/store/c10d_store_server.h) and C10dStore speak
// the wire protocol of torch's c10d TCPStore (torch/csrc/distributed/c10d/TCPStore*.cpp), so torch
// processes and weightcast processes can meet in one store, whichever side hosts it.
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

namespace weightcast::comm {

class C10dConnection;

enum class C10dProtocol { kAuto, kTorch1, kTorch2 };

std::string_view to_string(C10dProtocol protocol);

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
  std::unique_ptr<C10dConnection> conn_;  // the one connection; serializes the calls
};

}  // namespace weightcast::comm
