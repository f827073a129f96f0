// C10dStore's state (internal to comm/store): the one connection to the store, the protocol
// generation in use, and the send and receive steps every call is made of. c10d_store.cc connects
// (detecting the generation under kAuto) and waits; c10d_store_calls.cc holds the Store calls.
// Lifetime: owned by its C10dStore. Threading: a call holds `mu` throughout (run()).
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "comm/store/c10d_protocol.h"
#include "comm/store/c10d_store.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace c10d_client {

// CANCEL_WAIT is answered at once by a live server; so are GET and MULTI_GET after their WAIT.
inline constexpr Millis kCancelBudget{5000};

// A request of query `q` with these keys and values.
c10d_protocol::Request request(c10d_protocol::Query q, std::vector<std::string> keys = {},
                               std::vector<std::string> values = {});

}  // namespace c10d_client

struct C10dStore::Impl {
  C10dStoreOptions opts;
  std::string peer;
  std::timed_mutex mu;
  net::Fd fd;  // invalid: reconnect before the next call
  std::optional<c10d_protocol::Generation> gen;

  void connect(Deadline deadline, bool retry);
  bool try_generation(net::Fd& conn, Deadline deadline, std::string* why);
  bool probe_torch1(int conn, Deadline deadline, bool* definitive);
  bool handshake_torch2(int conn, Deadline deadline, std::string* why);

  // Locks, connects if needed, runs f(deadline); any exception closes the connection.
  template <typename F>
  auto run(Millis timeout, const char* what, F&& f) {
    const Deadline deadline = deadline_after(timeout);
    std::unique_lock lock(mu, std::defer_lock);
    if (!lock.try_lock_until(deadline)) {
      throw TimeoutError(detail::concat("c10d store ", what, " at ", peer,
                                        " timed out waiting for another call on this client"));
    }
    try {
      if (!fd) connect(deadline, /*retry=*/false);
      return f(deadline);
    } catch (...) {
      fd.reset();
      throw;
    }
  }

  [[noreturn]] void io_failed(const net::IoResult& r, const char* what) const {
    if (r.io == net::Io::kTimeout) {
      throw TimeoutError(
          detail::concat("c10d store ", what, " at ", peer, " got no reply in time"));
    }
    throw PeerError(peer,
                    detail::concat("c10d store connection lost during ", what, ": ", r.describe()));
  }
  void send(const c10d_protocol::Request& req, Deadline deadline) {
    const auto r = net::send_all(fd.get(), c10d_protocol::encode_request(*gen, req), deadline);
    if (!r.ok()) io_failed(r, c10d_protocol::query_name(req.query));
  }
  void recv(char* buf, std::size_t n, Deadline deadline, const char* what) {
    const auto r = net::recv_exact(fd.get(), buf, n, deadline);
    if (!r.ok()) io_failed(r, what);
  }
  std::uint8_t recv_u8(Deadline deadline, const char* what) {
    char b = 0;
    recv(&b, 1, deadline, what);
    return static_cast<std::uint8_t>(b);
  }
  std::int64_t recv_i64(Deadline deadline, const char* what) {
    char b[8];
    recv(b, sizeof(b), deadline, what);
    return c10d_protocol::read_i64(b);
  }
  std::string recv_bytes(Deadline deadline, const char* what);
  std::int64_t exchange_i64(const c10d_protocol::Request& req, Deadline deadline) {
    send(req, deadline);
    return recv_i64(deadline, c10d_protocol::query_name(req.query));
  }

  // WAIT on wire keys; false when the deadline passed first (the connection stays usable for
  // 2.x, which cancels; a 1.x one is closed, since its STOP_WAITING may still come).
  bool wait_wire(const std::vector<std::string>& keys, Deadline deadline);
  [[noreturn]] void wait_timed_out(const std::vector<std::string>& user_keys, Millis timeout);
  std::vector<std::string> missing(const std::vector<std::string>& user_keys);
  void require_torch2(const char* what) const {
    if (gen != c10d_protocol::Generation::kTorch2) {
      throw ConfigError(detail::concat("c10d store ", what, " needs the torch 2.x protocol; ", peer,
                                       " is spoken to as torch 1.x"));
    }
  }
};

}  // namespace weightcast::comm
