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
#include "comm/store/c10d_store.h"
#include "comm/store/c10d_store_state.h"
#include "comm/store/connection_server.h"
#include "comm/store/store_quota.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace proto = c10d_protocol;

namespace {

constexpr std::size_t kReadChunk = 64 * 1024;
// torch clients have one WAIT outstanding; a 1.x client that timed out may leave one behind and
// send another. More than this on one connection is abuse.
constexpr std::size_t kMaxPendingWaits = 64;
const std::string kInitKey = "init/";
// What a connection may buffer (requests in, replies out) without drawing on the shared budget.
constexpr std::size_t kFreeBufferBytes = kReadChunk;

enum class Woke { kSocket, kWake, kBoth, kTimeout, kStopped, kError };

// Polls the socket and the connection's eventfd until one is readable, the deadline passes or
// stop is set (checked every kStopPollSlice).
Woke poll_two(int fd, int wake_fd, Deadline deadline, const std::atomic<bool>& stop) {
  while (true) {
    if (stop.load()) return Woke::kStopped;
    if (expired(deadline)) return Woke::kTimeout;
    const Millis slice = std::min(remaining(deadline), net::kStopPollSlice);
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int r = ::poll(p, 2, static_cast<int>(slice.count()) + 1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Woke::kError;
    }
    if (r == 0) continue;
    const bool sock = p[0].revents != 0;
    const bool wake = p[1].revents != 0;
    return sock && wake ? Woke::kBoth : sock ? Woke::kSocket : Woke::kWake;
  }
}

}  // namespace

struct C10dStoreServer::Impl {
  // What one connection thread knows about its peer.
  struct Session {
    int fd = -1;
    int wake_fd = -1;
    std::optional<proto::Generation> gen;
    bool seen_first = false;
    std::list<std::vector<std::string>> pending;  // outstanding WAITs, oldest first
    std::string in;                               // bytes read, not yet decoded
    std::string out;                              // replies not yet sent
    bool consumed = false;                        // the last process() completed a request
    bool refused = false;                         // refuse() ran: a cap, not a bad frame
    std::size_t charged = 0;                      // bytes drawn from the shared buffer budget
  };

  explicit Impl(C10dStoreServerOptions o)
      : opts(std::move(o)),
        limits{opts.max_key_bytes, opts.max_value_bytes, opts.max_keys_per_request,
               opts.max_request_bytes},
        state(opts.max_store_bytes, opts.max_keys, opts.max_value_bytes) {}

  C10dStoreServerOptions opts;
  proto::Limits limits;
  const std::atomic<bool>* stopping = nullptr;  // the connection server's stop flag
  C10dStoreState state;

  std::atomic<std::uint64_t> rejected_frames{0}, dropped_stalled{0}, dropped_over_cap{0}, torch1{0},
      torch2{0};
  std::atomic<std::size_t> buffered{0};  // drawn from max_buffered_bytes by all connections

  // Logs why the connection is dropped, with its peer, and counts it; returns false, for callers
  // to return.
  bool refuse(Session& s, const std::string& why) {
    s.refused = true;
    ++dropped_over_cap;
    std::fprintf(stderr, "weightcast: c10d store server drops the connection from %s: %s\n",
                 net::peer_name(s.fd).c_str(), why.c_str());
    return false;
  }
  // Brings the connection's draw on the shared budget to what its buffers hold beyond
  // kFreeBufferBytes; refuses (false) when that would pass max_buffered_bytes.
  bool recharge(Session& s) {
    const std::size_t held = s.in.size() + s.out.size();
    const std::size_t want = held > kFreeBufferBytes ? held - kFreeBufferBytes : 0;
    if (want <= s.charged) {
      buffered -= s.charged - want;
      s.charged = want;
      return true;
    }
    const std::size_t more = want - s.charged;
    if (buffered.fetch_add(more) + more > opts.max_buffered_bytes) {
      buffered -= more;
      return refuse(s, detail::concat("its ", held,
                                      " buffered bytes would take all connections "
                                      "past the cap of ",
                                      opts.max_buffered_bytes));
    }
    s.charged = want;
    return true;
  }

  void serve(int fd);
  void serve_loop(Session& s);
  // Decodes and answers every complete request in s.in; false drops the connection.
  bool process(Session& s);
  bool handle(Session& s, const proto::Request& req);
  bool answer(Session& s, const proto::Request& req);  // handle() past VALIDATE
  bool handle_add(Session& s, const proto::Request& req);
  bool handle_multi_get(Session& s, const proto::Request& req);
  // Sends the replies that passed max_unsent_reply_bytes before anything more is read.
  bool flush_over_cap(Session& s);
  bool handle_wait(Session& s, std::vector<std::string> keys);
  void cancel_waits(Session& s);
  void answer_ready_waits(Session& s);
  bool flush(Session& s) {
    if (s.out.empty()) return true;
    const bool ok = net::send_all(s.fd, s.out, deadline_after(opts.io_timeout), stopping).ok();
    s.out.clear();
    return ok;
  }
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
  Session s;
  s.fd = fd;
  s.wake_fd = wake.get();
  serve_loop(s);
  buffered -= s.charged;
  state.unwatch(s.wake_fd);  // before the eventfd closes, so no change writes to a reused fd
  // The peer learns at once that it was dropped; the fd itself closes when the reaper joins us.
  ::shutdown(fd, SHUT_RDWR);
}

void C10dStoreServer::Impl::serve_loop(Session& s) {
  // Idle connections (torch 1.x keeps an idle callback socket) may stay forever; a request that
  // has started must complete within io_timeout.
  Deadline request_deadline = Deadline::max();
  while (true) {
    const Woke w = poll_two(s.fd, s.wake_fd, request_deadline, *stopping);
    if (w == Woke::kTimeout) {
      ++dropped_stalled;
      return;
    }
    if (w == Woke::kStopped || w == Woke::kError) return;
    if (w == Woke::kWake || w == Woke::kBoth) {
      eventfd_t ignored = 0;
      (void)::eventfd_read(s.wake_fd, &ignored);
      answer_ready_waits(s);
      if (!flush(s)) return;
    }
    if (w == Woke::kWake) continue;
    const std::size_t before = s.in.size();
    s.in.resize(before + kReadChunk);
    const ssize_t n = ::recv(s.fd, s.in.data() + before, kReadChunk, 0);
    s.in.resize(before + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n == 0) return;  // EOF
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    if (!recharge(s)) return;
    if (!process(s)) {
      if (!s.refused) ++rejected_frames;
      return;
    }
    if (!recharge(s) || !flush(s) || !recharge(s)) return;
    // A partial request left over starts (or keeps) its clock; a clean boundary stops it.
    if (s.in.empty()) {
      request_deadline = Deadline::max();
    } else if (before == 0 || s.consumed) {
      request_deadline = deadline_after(opts.io_timeout);
    }
  }
}

bool C10dStoreServer::Impl::process(Session& s) {
  s.consumed = false;
  while (!s.in.empty()) {
    if (!s.gen) {
      s.gen = proto::detect_generation(s.in);
      if (!s.gen) return true;  // a 0 byte so far: VALIDATE or a 1.x SET, not yet known
      ++(*s.gen == proto::Generation::kTorch2 ? torch2 : torch1);
    }
    auto d = proto::decode_request(*s.gen, s.in, limits);
    if (d.status == proto::Decode::kNeedMore) return true;
    if (d.status == proto::Decode::kBad) return false;
    s.in.erase(0, d.consumed);
    s.consumed = true;
    // Every reply is charged to the shared budget as soon as it is made.
    if (!handle(s, d.request) || !recharge(s)) return false;
    if (!flush_over_cap(s)) return false;
  }
  return true;
}

bool C10dStoreServer::Impl::flush_over_cap(Session& s) {
  if (s.out.size() <= opts.max_unsent_reply_bytes) return true;
  if (!recharge(s)) return false;
  const std::size_t unsent = s.out.size();
  if (!flush(s)) {
    return refuse(s, detail::concat("it left ", unsent, " bytes of replies (cap ",
                                    opts.max_unsent_reply_bytes, ") untaken for ",
                                    opts.io_timeout.count(), " ms"));
  }
  return recharge(s);
}

// Answers one request into s.out; false when it is out of protocol (the connection is dropped).
bool C10dStoreServer::Impl::handle(Session& s, const proto::Request& req) {
  using proto::Query;
  // 2.x: VALIDATE opens the connection (detect_generation saw it) and comes only once.
  const bool first = !s.seen_first;
  s.seen_first = true;
  if (req.query == Query::kValidate) return first && req.word == proto::kValidateMagic;
  try {
    return answer(s, req);
  } catch (const StoreFullError& e) {
    return refuse(s, detail::concat(proto::query_name(req.query), ": ", e.what()));
  } catch (const BadRequestError&) {
    return false;  // ADD on a value that is not a counter, or an overflow: out of protocol
  }
}

bool C10dStoreServer::Impl::answer(Session& s, const proto::Request& req) {
  using proto::Query;
  switch (req.query) {
    case Query::kSet:
      state.set(req.keys[0], req.values[0]);
      return true;
    case Query::kCompareSet:
      proto::append_bytes(&s.out, state.compare_set(req.keys[0], req.values[0], req.values[1]));
      return true;
    case Query::kGet:
      // A missing key reads as empty, as torch's libuv server answers (the legacy one dropped the
      // connection); torch clients WAIT before they GET, so they never see the difference.
      proto::append_bytes(&s.out, state.get(req.keys[0]).value_or(std::string()));
      return true;
    case Query::kAdd:
      return handle_add(s, req);
    case Query::kCheck:
      proto::append_u8(&s.out,
                       state.has_all(req.keys) ? proto::kCheckReady : proto::kCheckNotReady);
      return true;
    case Query::kWait:
      return handle_wait(s, req.keys);
    case Query::kGetNumKeys:
      proto::append_i64(&s.out, state.size());
      return true;
    case Query::kDeleteKey:
      proto::append_i64(&s.out, state.erase(req.keys[0]) ? 1 : 0);
      return true;
    case Query::kAppend:
      state.append(req.keys[0], req.values[0]);
      return true;
    case Query::kMultiGet:
      return handle_multi_get(s, req);
    case Query::kMultiSet:
      for (std::size_t i = 0; i < req.keys.size(); ++i) state.set(req.keys[i], req.values[i]);
      return true;
    case Query::kCancelWait:
      cancel_waits(s);
      return true;
    case Query::kPing:
      proto::append_u32(&s.out, req.word);
      return true;
    case Query::kWatchKey:  // torch 1.x watchKey callbacks are not served
    case Query::kValidate:
      return false;
  }
  return false;
}

bool C10dStoreServer::Impl::handle_add(Session& s, const proto::Request& req) {
  // Not a counter, an overflow (handle() drops the connection: torch has no error reply either)
  // or a full store (refused, logged).
  proto::append_i64(&s.out, state.add(req.keys[0], req.delta));
  return true;
}

bool C10dStoreServer::Impl::handle_multi_get(Session& s, const proto::Request& req) {
  // 131,072 keys naming one 8 MiB value are a 1 TiB reply from a 1 MiB request: no reply may be
  // larger than a request may be.
  const std::size_t start = s.out.size();
  for (const auto& k : req.keys) {
    proto::append_bytes(&s.out, state.get(k).value_or(std::string()));
    if (!recharge(s)) {  // refused: the budget of all connections is spent
      s.out.resize(start);
      return false;
    }
    if (s.out.size() - start > opts.max_request_bytes) {
      s.out.resize(start);
      return refuse(
          s, detail::concat("MULTI_GET of ", req.keys.size(), " keys: its reply passes the cap of ",
                            opts.max_request_bytes, " bytes"));
    }
  }
  return true;
}

bool C10dStoreServer::Impl::handle_wait(Session& s, std::vector<std::string> keys) {
  if (state.watch_unless_ready(keys, s.wake_fd)) {
    proto::append_u8(&s.out, proto::kStopWaiting);
    return true;
  }
  if (s.pending.size() >= kMaxPendingWaits) return false;
  s.pending.push_back(std::move(keys));
  return true;
}

void C10dStoreServer::Impl::cancel_waits(Session& s) {
  s.pending.clear();
  state.unwatch(s.wake_fd);
  proto::append_u8(&s.out, proto::kWaitCanceled);
}

void C10dStoreServer::Impl::answer_ready_waits(Session& s) {
  for (auto it = s.pending.begin(); it != s.pending.end();) {
    if (state.has_all(*it)) {
      proto::append_u8(&s.out, proto::kStopWaiting);
      it = s.pending.erase(it);
    } else {
      ++it;
    }
  }
  if (s.pending.empty()) state.unwatch(s.wake_fd);
}

}  // namespace weightcast::comm
