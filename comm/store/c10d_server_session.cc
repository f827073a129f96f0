// C10dServerSession (comm/store/c10d_server_session.h): one connection's reads, requests and
// replies, within the bounds of comm/store/c10d_store_server.cc's file comment.
#include "comm/store/c10d_server_session.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "comm/errors.h"
#include "comm/store/store_quota.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace proto = c10d_protocol;

namespace {

constexpr std::size_t kReadChunk = 64 * 1024;
// torch clients have one WAIT outstanding; a 1.x client that timed out may leave one behind and
// send another. More than this on one connection is abuse.
constexpr std::size_t kMaxPendingWaits = 64;
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

bool C10dServerSession::refuse(const std::string& why) {
  refused_ = true;
  ++shared_.dropped_over_cap;
  std::fprintf(stderr, "weightcast: c10d store server drops the connection from %s: %s\n",
               net::peer_name(fd_).c_str(), why.c_str());
  return false;
}
bool C10dServerSession::recharge() {
  const std::size_t held = in_.size() + out_.size();
  const std::size_t want = held > kFreeBufferBytes ? held - kFreeBufferBytes : 0;
  if (want <= charged_) {
    shared_.buffered -= charged_ - want;
    charged_ = want;
    return true;
  }
  const std::size_t more = want - charged_;
  if (shared_.buffered.fetch_add(more) + more > shared_.opts.max_buffered_bytes) {
    shared_.buffered -= more;
    return refuse(detail::concat("its ", held,
                                 " buffered bytes would take all connections "
                                 "past the cap of ",
                                 shared_.opts.max_buffered_bytes));
  }
  charged_ = want;
  return true;
}

bool C10dServerSession::flush() {
  if (out_.empty()) return true;
  const bool ok =
      net::send_all(fd_, out_, deadline_after(shared_.opts.io_timeout), shared_.stopping).ok();
  out_.clear();
  return ok;
}

void C10dServerSession::serve_loop() {
  // Idle connections (torch 1.x keeps an idle callback socket) may stay forever; a request that
  // has started must complete within io_timeout.
  Deadline request_deadline = Deadline::max();
  while (true) {
    const Woke w = poll_two(fd_, wake_fd_, request_deadline, *shared_.stopping);
    if (w == Woke::kTimeout) {
      ++shared_.dropped_stalled;
      return;
    }
    if (w == Woke::kStopped || w == Woke::kError) return;
    if (w == Woke::kWake || w == Woke::kBoth) {
      eventfd_t ignored = 0;
      (void)::eventfd_read(wake_fd_, &ignored);
      answer_ready_waits();
      if (!flush()) return;
    }
    if (w == Woke::kWake) continue;
    const std::size_t before = in_.size();
    in_.resize(before + kReadChunk);
    const ssize_t n = ::recv(fd_, in_.data() + before, kReadChunk, 0);
    in_.resize(before + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n == 0) return;  // EOF
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    if (!recharge()) return;
    if (!process()) {
      if (!refused_) ++shared_.rejected_frames;
      return;
    }
    if (!recharge() || !flush() || !recharge()) return;
    // A partial request left over starts (or keeps) its clock; a clean boundary stops it.
    if (in_.empty()) {
      request_deadline = Deadline::max();
    } else if (before == 0 || consumed_) {
      request_deadline = deadline_after(shared_.opts.io_timeout);
    }
  }
}

bool C10dServerSession::process() {
  consumed_ = false;
  while (!in_.empty()) {
    if (!gen_) {
      gen_ = proto::detect_generation(in_);
      if (!gen_) return true;  // a 0 byte so far: VALIDATE or a 1.x SET, not yet known
      ++(*gen_ == proto::Generation::kTorch2 ? shared_.torch2 : shared_.torch1);
    }
    auto d = proto::decode_request(*gen_, in_, shared_.limits);
    if (d.status == proto::Decode::kNeedMore) return true;
    if (d.status == proto::Decode::kBad) return false;
    in_.erase(0, d.consumed);
    consumed_ = true;
    // Every reply is charged to the shared budget as soon as it is made.
    if (!handle(d.request) || !recharge()) return false;
    if (!flush_over_cap()) return false;
  }
  return true;
}

bool C10dServerSession::flush_over_cap() {
  if (out_.size() <= shared_.opts.max_unsent_reply_bytes) return true;
  if (!recharge()) return false;
  const std::size_t unsent = out_.size();
  if (!flush()) {
    return refuse(detail::concat("it left ", unsent, " bytes of replies (cap ",
                                 shared_.opts.max_unsent_reply_bytes, ") untaken for ",
                                 shared_.opts.io_timeout.count(), " ms"));
  }
  return recharge();
}

// Answers one request into out_; false when it is out of protocol (the connection is dropped).
bool C10dServerSession::handle(const proto::Request& req) {
  using proto::Query;
  // 2.x: VALIDATE opens the connection (detect_generation saw it) and comes only once.
  const bool first = !seen_first_;
  seen_first_ = true;
  if (req.query == Query::kValidate) return first && req.word == proto::kValidateMagic;
  try {
    return answer(req);
  } catch (const StoreFullError& e) {
    return refuse(detail::concat(proto::query_name(req.query), ": ", e.what()));
  } catch (const BadRequestError&) {
    return false;  // ADD on a value that is not a counter, or an overflow: out of protocol
  }
}

bool C10dServerSession::answer(const proto::Request& req) {
  using proto::Query;
  switch (req.query) {
    case Query::kSet:
      shared_.state.set(req.keys[0], req.values[0]);
      return true;
    case Query::kCompareSet:
      proto::append_bytes(&out_,
                          shared_.state.compare_set(req.keys[0], req.values[0], req.values[1]));
      return true;
    case Query::kGet:
      // A missing key reads as empty, as torch's libuv server answers (the legacy one dropped the
      // connection); torch clients WAIT before they GET, so they never see the difference.
      proto::append_bytes(&out_, shared_.state.get(req.keys[0]).value_or(std::string()));
      return true;
    case Query::kAdd:
      return handle_add(req);
    case Query::kCheck:
      proto::append_u8(
          &out_, shared_.state.has_all(req.keys) ? proto::kCheckReady : proto::kCheckNotReady);
      return true;
    case Query::kWait:
      return handle_wait(req.keys);
    case Query::kGetNumKeys:
      proto::append_i64(&out_, shared_.state.size());
      return true;
    case Query::kDeleteKey:
      proto::append_i64(&out_, shared_.state.erase(req.keys[0]) ? 1 : 0);
      return true;
    case Query::kAppend:
      shared_.state.append(req.keys[0], req.values[0]);
      return true;
    case Query::kMultiGet:
      return handle_multi_get(req);
    case Query::kMultiSet:
      for (std::size_t i = 0; i < req.keys.size(); ++i)
        shared_.state.set(req.keys[i], req.values[i]);
      return true;
    case Query::kCancelWait:
      cancel_waits();
      return true;
    case Query::kPing:
      proto::append_u32(&out_, req.word);
      return true;
    case Query::kWatchKey:  // torch 1.x watchKey callbacks are not served
    case Query::kValidate:
      return false;
  }
  return false;
}

bool C10dServerSession::handle_add(const proto::Request& req) {
  // Not a counter, an overflow (handle() drops the connection: torch has no error reply either)
  // or a full store (refused, logged).
  proto::append_i64(&out_, shared_.state.add(req.keys[0], req.delta));
  return true;
}

bool C10dServerSession::handle_multi_get(const proto::Request& req) {
  // 131,072 keys naming one 8 MiB value are a 1 TiB reply from a 1 MiB request: no reply may be
  // larger than a request may be.
  const std::size_t start = out_.size();
  for (const auto& k : req.keys) {
    proto::append_bytes(&out_, shared_.state.get(k).value_or(std::string()));
    if (!recharge()) {  // refused: the budget of all connections is spent
      out_.resize(start);
      return false;
    }
    if (out_.size() - start > shared_.opts.max_request_bytes) {
      out_.resize(start);
      return refuse(detail::concat("MULTI_GET of ", req.keys.size(),
                                   " keys: its reply passes the cap of ",
                                   shared_.opts.max_request_bytes, " bytes"));
    }
  }
  return true;
}

bool C10dServerSession::handle_wait(std::vector<std::string> keys) {
  if (shared_.state.watch_unless_ready(keys, wake_fd_)) {
    proto::append_u8(&out_, proto::kStopWaiting);
    return true;
  }
  if (pending_.size() >= kMaxPendingWaits) return false;
  pending_.push_back(std::move(keys));
  return true;
}

void C10dServerSession::cancel_waits() {
  pending_.clear();
  shared_.state.unwatch(wake_fd_);
  proto::append_u8(&out_, proto::kWaitCanceled);
}

void C10dServerSession::answer_ready_waits() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (shared_.state.has_all(*it)) {
      proto::append_u8(&out_, proto::kStopWaiting);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  if (pending_.empty()) shared_.state.unwatch(wake_fd_);
}

}  // namespace weightcast::comm
