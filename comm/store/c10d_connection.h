// C10dConnection: C10dStore's one connection to a torch c10d store, the protocol generation in
// use (detected under kAuto when constructed) and the send and receive steps every call is made
// of. Any failure mid-exchange closes the connection (the byte stream may be out of step) and the
// next call reconnects, redoing VALIDATE and PING for 2.x.
//
// Protocol detection (kAuto), done once when constructed:
//   1. Send the 1.x GETNUMKEYS query (the single byte 6, no arguments). A 1.x server answers with
//      8 bytes. A 2.x server sees a first query that is not VALIDATE: the legacy backend drops the
//      connection, the libuv one leaves it unanswered (byte 6 is 2.x WAIT, waiting for a key count
//      that never comes). Either way nothing is stored or allocated on the server.
//   2. On EOF or after kProbeBudget of silence, connect again and speak 2.x: VALIDATE, then PING,
//      which must echo the nonce. A 1.x server too slow for step 1 drops this connection (it reads
//      VALIDATE as a SET with an impossible key length), and the detection starts over, until
//      connect_timeout.
// The probe is never sent to 2.x first because a 2.x handshake read by a 1.x server is that
// impossible SET. A weightcast server answers the 1.x probe, so kAuto speaks 1.x to it; ask for
// kTorch2 to use the 2.x-only calls.
//
// Lifetime: owned by its C10dStore (internal to comm/store). Threading: a call holds the timed
// mutex throughout (run()); waiting for it counts against the call's timeout.
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

class C10dConnection {
 public:
  // Checks the options, then connects (retrying until connect_timeout), resolving kAuto.
  explicit C10dConnection(C10dStoreOptions opts);

  const C10dStoreOptions& options() const { return opts_; }
  const std::string& peer() const { return peer_; }
  // The generation in use (resolved once connected).
  C10dProtocol protocol() const;

  // Locks, connects if needed, runs f(deadline); any exception closes the connection.
  template <typename F>
  auto run(Millis timeout, const char* what, F&& f) {
    const Deadline deadline = deadline_after(timeout);
    std::unique_lock lock(mu_, std::defer_lock);
    if (!lock.try_lock_until(deadline)) {
      throw TimeoutError(detail::concat("c10d store ", what, " at ", peer_,
                                        " timed out waiting for another call on this client"));
    }
    try {
      if (!fd_) connect(deadline, /*retry=*/false);
      return f(deadline);
    } catch (...) {
      fd_.reset();
      throw;
    }
  }

  void send(const c10d_protocol::Request& req, Deadline deadline) {
    const auto r = net::send_all(fd_.get(), c10d_protocol::encode_request(*gen_, req), deadline);
    if (!r.ok()) io_failed(r, c10d_protocol::query_name(req.query));
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
  void require_torch2(const char* what) const {
    if (gen_ != c10d_protocol::Generation::kTorch2) {
      throw ConfigError(detail::concat("c10d store ", what, " needs the torch 2.x protocol; ",
                                       peer_, " is spoken to as torch 1.x"));
    }
  }

 private:
  void connect(Deadline deadline, bool retry);
  bool try_generation(net::Fd& conn, Deadline deadline, std::string* why);
  bool probe_torch1(int conn, Deadline deadline, bool* definitive);
  bool handshake_torch2(int conn, Deadline deadline, std::string* why);
  [[noreturn]] void io_failed(const net::IoResult& r, const char* what) const {
    if (r.io == net::Io::kTimeout) {
      throw TimeoutError(
          detail::concat("c10d store ", what, " at ", peer_, " got no reply in time"));
    }
    throw PeerError(peer_,
                    detail::concat("c10d store connection lost during ", what, ": ", r.describe()));
  }
  void recv(char* buf, std::size_t n, Deadline deadline, const char* what) {
    const auto r = net::recv_exact(fd_.get(), buf, n, deadline);
    if (!r.ok()) io_failed(r, what);
  }
  // Which of `user_keys` are missing, asked one CHECK each on a connection in step.
  std::vector<std::string> missing(const std::vector<std::string>& user_keys);

  C10dStoreOptions opts_;
  std::string peer_;
  std::timed_mutex mu_;
  net::Fd fd_;  // invalid: reconnect before the next call
  std::optional<c10d_protocol::Generation> gen_;
};

}  // namespace weightcast::comm
