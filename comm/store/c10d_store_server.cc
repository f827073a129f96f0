// C10dStoreServer: a ConnectionServer (connection_server.h: acceptor, one thread per connection,
// reaping, stop), as TcpStoreServer. A connection thread owns its socket: it reads a byte stream,
// decodes torch requests as they complete (c10d_protocol.h) and answers them. A WAIT whose keys are
// missing does not block the thread: it is kept as pending, the thread registers an eventfd with
// the state and goes on reading, and answers STOP_WAITING when a change makes the keys present — so
// CANCEL_WAIT (2.x) and further requests on the same connection are still read, and other
// connections never wait on this one.
//
// Bounds (C10dStoreServerOptions, docs/security.md): the state refuses changes past the store's
// byte and key caps; a connection is not read further while its unsent replies exceed
// max_unsent_reply_bytes (they are sent first, within io_timeout); one reply may not exceed
// max_request_bytes; and all connections' buffers beyond a free 64 KiB each share one budget. torch
// has no error reply, so every refusal drops the connection that asked and is logged with its peer.
#include "comm/store/c10d_store_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <list>
#include <optional>

#include "comm/errors.h"
#include "comm/store/c10d_protocol.h"
#include "comm/store/c10d_server_session.h"
#include "comm/store/c10d_store_state.h"
#include "comm/store/connection_server.h"
#include "comm/store/store_quota.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace proto = c10d_protocol;

namespace {

const std::string kInitKey = "init/";

}  // namespace

struct C10dStoreServer::Impl : C10dServerShared {
  using C10dServerShared::C10dServerShared;
  void serve(int fd);  // one connection thread
};

namespace {

C10dStoreServerOptions checked(C10dStoreServerOptions opts) {
  if (opts.max_connections == 0) throw ConfigError("c10d store max_connections must be positive");
  if (opts.io_timeout <= Millis(0)) throw ConfigError("c10d store io_timeout must be positive");
  if (opts.max_key_bytes == 0 || opts.max_keys_per_request == 0) {
    throw ConfigError("c10d store key limits must be positive");
  }
  if (opts.max_request_bytes < opts.max_value_bytes + opts.max_key_bytes + 32) {
    throw ConfigError(detail::concat("c10d store max_request_bytes ", opts.max_request_bytes,
                                     " cannot hold one SET of the largest key and value"));
  }
  if (opts.max_unsent_reply_bytes == 0 || opts.max_buffered_bytes == 0) {
    throw ConfigError("c10d store buffer caps must be positive");
  }
  return opts;
}

}  // namespace

C10dStoreServer::C10dStoreServer(C10dStoreServerOptions opts)
    : impl_(std::make_unique<Impl>(checked(std::move(opts)))) {
  auto& s = *impl_;
  ConnectionServer& server =
      listen({s.opts.bind_address, s.opts.port, s.opts.max_connections, "c10d store server"},
             [&s] { s.state.stop(); });
  s.stopping = &server.stopping();
  // torch's protocol has no error reply: closing a connection over the limit is the refusal.
  server.start([&s](int fd) { s.serve(fd); });
}

C10dStoreServer::~C10dStoreServer() {
  stop();
}

C10dStoreServerStats C10dStoreServer::stats() const {
  const auto& s = *impl_;
  const ConnectionCounts c = connections().counts();
  C10dStoreServerStats st;
  st.accepted = c.accepted;
  st.refused = c.refused;
  st.active = c.active;
  st.rejected_frames = s.rejected_frames.load();
  st.dropped_stalled = s.dropped_stalled.load();
  st.torch1_connections = s.torch1.load();
  st.torch2_connections = s.torch2.load();
  st.dropped_over_cap = s.dropped_over_cap.load();
  st.store_bytes = s.state.bytes();
  st.buffered_bytes = s.buffered.load();
  return st;
}

std::vector<std::string> C10dStoreServer::keys() const {
  return impl_->state.keys();
}

void C10dStoreServer::wait_for_workers(std::int64_t workers, Millis timeout) {
  WC_ENFORCE_GT(workers, std::int64_t{0}, "wait_for_workers needs a positive count");
  const std::int64_t seen = impl_->state.wait_counter(kInitKey, workers, deadline_after(timeout));
  if (seen >= workers) return;
  throw TimeoutError(detail::concat(
      "timed out after ", timeout.count(), " ms waiting for workers at the c10d store ",
      net::endpoint(host(), port()), ": ", seen, "/", workers, " joined"));
}

void C10dStoreServer::Impl::serve(int fd) {
  net::Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake) return;
  C10dServerSession session(*this, fd, wake.get());
  session.serve_loop();
  buffered -= session.charged();
  state.unwatch(wake.get());  // before the eventfd closes, so no change writes to a reused fd
  // The peer learns at once that it was dropped; the fd itself closes when the reaper joins us.
  ::shutdown(fd, SHUT_RDWR);
}

}  // namespace weightcast::comm
