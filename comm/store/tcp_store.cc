// TcpStore client: one connection, calls serialized by a timed mutex (so waiting for another
// thread's call is bounded too). Any failure that may leave the connection mid-frame closes it;
// the next call reconnects, so a late reply can never be read as the answer to a later request.
#include <algorithm>
#include <mutex>

#include "comm/errors.h"
#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace proto = store_protocol;

namespace {

// Room for the server's reply after it spends the whole timeout waiting for a key.
constexpr Millis kReplyMargin{2000};
// Timeouts travel as u32 milliseconds; clamping also keeps deadline arithmetic from overflowing.
constexpr Millis kMaxTimeout{UINT32_MAX};

Millis clamp_timeout(Millis t) {
  return std::clamp(t, Millis(0), kMaxTimeout);
}

}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions opts;
  std::string peer;  // host:port, for every error message
  std::timed_mutex mu;
  net::Fd fd;  // invalid: reconnect before the next call

  void connect(Deadline deadline, bool retry);
  enum class Handshake { kDone, kRetry, kTimedOut };
  // Sends HELLO on a fresh connection; refusals that retrying cannot fix throw.
  Handshake handshake(net::Fd& conn, Deadline deadline, std::string* why);
  proto::Response exchange(int conn, const proto::Request& req, Deadline deadline);
  // A full call: waits for the connection, reconnects if needed, maps statuses to errors. With
  // `value_size` set, a reply value of another size is a protocol violation.
  proto::Response call(proto::Request req, Millis timeout, Millis io_budget,
                       std::size_t value_size = kAnySize);

  static constexpr std::size_t kAnySize = ~std::size_t{0};
};

TcpStore::TcpStore(TcpStoreOptions opts) : impl_(std::make_unique<Impl>()) {
  if (opts.port == 0) throw ConfigError("store client needs a port (got 0)");
  if (opts.max_value_bytes > proto::kMaxValueBytesLimit) {
    throw ConfigError(detail::concat("store max_value_bytes ", opts.max_value_bytes,
                                     " exceeds the protocol limit of ",
                                     proto::kMaxValueBytesLimit));
  }
  if (opts.token.size() > proto::kMaxTokenBytes) {
    throw ConfigError(detail::concat("store token of ", opts.token.size(),
                                     " bytes exceeds the limit of ", proto::kMaxTokenBytes));
  }
  impl_->opts = std::move(opts);
  impl_->peer = net::endpoint(impl_->opts.host, impl_->opts.port);
  impl_->connect(deadline_after(clamp_timeout(impl_->opts.connect_timeout)), /*retry=*/true);
}

TcpStore::~TcpStore() = default;

std::size_t TcpStore::max_value_bytes() const {
  return impl_->opts.max_value_bytes;
}

void TcpStore::Impl::connect(Deadline deadline, bool retry) {
  net::ConnectRetry pacing(peer, "store server", "store", opts.connect_timeout, deadline, retry);
  std::string why;  // the most telling failure so far, for the final error
  while (true) {
    bool timed_out = false;
    std::string attempt;
    net::Fd conn = net::connect_once(opts.host, opts.port, deadline, &attempt, &timed_out);
    if (conn) {
      auto outcome = handshake(conn, deadline, &attempt);
      if (outcome == Handshake::kDone) {
        fd = std::move(conn);
        return;
      }
      timed_out = outcome == Handshake::kTimedOut;
    }
    // "Timed out" says less than an earlier refusal ("at its connection limit"): keep that.
    if (!timed_out || why.empty()) why = attempt;
    if (!retry && timed_out) {
      throw TimeoutError(detail::concat("reconnecting to the store at ", peer, ": ", why));
    }
    pacing.failed(why);
  }
}

TcpStore::Impl::Handshake TcpStore::Impl::handshake(net::Fd& conn, Deadline deadline,
                                                    std::string* why) {
  proto::Request hello;
  hello.op = proto::Op::kHello;
  hello.keys = {std::string(proto::kProtocolName)};
  hello.value = opts.token;
  proto::Response resp;
  try {
    resp = exchange(conn.get(), hello, deadline);
  } catch (const PeerError& e) {
    *why = e.what();
    return Handshake::kRetry;  // e.g. a server still starting up, or one at its limit
  } catch (const TimeoutError& e) {
    *why = e.what();
    return Handshake::kTimedOut;
  } catch (const BadRequestError& e) {
    // An absurd reply length to HELLO: whatever listens there does not speak this protocol.
    throw PeerError(peer, detail::concat("not a weightcast store server: ", e.what()));
  }
  switch (resp.status) {
    case proto::Status::kOk:
      return Handshake::kDone;
    case proto::Status::kUnauthorized:
    case proto::Status::kForbidden:
      throw ConfigError(detail::concat("store token refused by ", peer, ": ", resp.message));
    case proto::Status::kUnavailable:
      *why = resp.message;
      return Handshake::kRetry;
    default:
      throw PeerError(peer, detail::concat("store handshake refused (",
                                           proto::status_name(resp.status), "): ", resp.message));
  }
}

// One request/reply on `conn`. I/O failures throw (TimeoutError, PeerError) without touching the
// stored fd; callers decide whether the connection survives.
proto::Response TcpStore::Impl::exchange(int conn, const proto::Request& req, Deadline deadline) {
  const std::string frame = proto::encode_request(req);
  const std::string_view what = proto::op_name(req.op);
  auto fail = [&](const net::IoResult& r) {
    if (r.io == net::Io::kTimeout) {
      throw TimeoutError(detail::concat("store ", what, " at ", peer, " got no reply in time"));
    }
    throw PeerError(peer,
                    detail::concat("store connection lost during ", what, ": ", r.describe()));
  };
  if (auto r = net::send_all(conn, frame, deadline); !r.ok()) fail(r);
  char header[proto::kFrameHeaderBytes];
  if (auto r = net::recv_exact(conn, header, sizeof(header), deadline); !r.ok()) fail(r);
  const std::uint32_t length = proto::decode_frame_length({header, sizeof(header)});
  if (auto check = proto::check_response_frame_length(length, opts.max_value_bytes); !check.ok()) {
    throw BadRequestError(detail::concat("store reply from ", peer, " refused: ", check.error));
  }
  std::string body;
  if (auto r = net::recv_append(conn, &body, length, deadline); !r.ok()) fail(r);
  auto decoded = proto::decode_response_body(body, opts.max_value_bytes);
  if (decoded.status == proto::Status::kTooLarge) {
    throw BadRequestError(detail::concat("store reply from ", peer, " refused: ", decoded.error));
  }
  if (!decoded.ok()) {
    throw PeerError(peer, detail::concat("malformed store reply to ", what, ": ", decoded.error));
  }
  return std::move(decoded.value);
}

proto::Response TcpStore::Impl::call(proto::Request req, Millis timeout, Millis io_budget,
                                     std::size_t value_size) {
  timeout = clamp_timeout(timeout);
  req.timeout_ms = static_cast<std::uint32_t>(timeout.count());
  const Deadline deadline = deadline_after(io_budget);
  std::unique_lock lock(mu, std::defer_lock);
  if (!lock.try_lock_until(deadline)) {
    throw TimeoutError(detail::concat("store ", proto::op_name(req.op), " at ", peer,
                                      " timed out waiting for another call on this client"));
  }
  if (!fd) connect(deadline, /*retry=*/false);
  proto::Response resp;
  try {
    resp = exchange(fd.get(), req, deadline);
  } catch (...) {
    fd.reset();  // possibly mid-frame: never reuse it
    throw;
  }
  if (!proto::keeps_connection(resp.status)) fd.reset();
  switch (resp.status) {
    case proto::Status::kOk:
      if (value_size != kAnySize && resp.value.size() != value_size) {
        fd.reset();
        throw PeerError(
            peer, detail::concat("malformed store reply to ", proto::op_name(req.op), ": value of ",
                                 resp.value.size(), " bytes, expected ", value_size));
      }
      return resp;
    case proto::Status::kTimeout:
      throw TimeoutError(
          detail::concat("store ", proto::op_name(req.op), " at ", peer, ": ", resp.message));
    case proto::Status::kRejected:
    case proto::Status::kTooLarge:
    case proto::Status::kBadRequest:
      throw BadRequestError(detail::concat("store ", proto::op_name(req.op), " refused by ", peer,
                                           " (", proto::status_name(resp.status),
                                           "): ", resp.message));
    case proto::Status::kUnauthorized:
    case proto::Status::kForbidden:
      throw ConfigError(detail::concat("store token refused by ", peer, ": ", resp.message));
    case proto::Status::kUnavailable:
      break;
  }
  throw PeerError(peer, detail::concat("store server refused ", proto::op_name(req.op), " (",
                                       proto::status_name(resp.status), "): ", resp.message));
}

void TcpStore::set(const std::string& key, std::string_view value, Millis timeout) {
  check_key(key);
  check_value(value, impl_->opts.max_value_bytes);
  proto::Request req;
  req.op = proto::Op::kSet;
  req.keys = {key};
  req.value = std::string(value);
  impl_->call(std::move(req), timeout, clamp_timeout(timeout));
}

std::string TcpStore::get(const std::string& key, Millis timeout) {
  check_key(key);
  proto::Request req;
  req.op = proto::Op::kGet;
  req.keys = {key};
  return impl_->call(std::move(req), timeout, clamp_timeout(timeout) + kReplyMargin).value;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  for (const auto& k : keys) check_key(k);
  if (keys.empty()) return;
  // The server bounds keys per frame; waits are idempotent, so chunks in turn under one deadline
  // mean the same as one wait.
  const Deadline deadline = deadline_after(clamp_timeout(timeout));
  for (std::size_t i = 0; i < keys.size(); i += proto::kMaxKeysPerRequest) {
    const std::size_t end = std::min(keys.size(), i + proto::kMaxKeysPerRequest);
    proto::Request req;
    req.op = proto::Op::kWait;
    req.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(i),
                    keys.begin() + static_cast<std::ptrdiff_t>(end));
    const Millis left = remaining(deadline);
    impl_->call(std::move(req), left, left + kReplyMargin);
  }
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta, Millis timeout) {
  check_key(key);
  proto::Request req;
  req.op = proto::Op::kAdd;
  req.keys = {key};
  req.value = proto::encode_i64(delta);
  auto resp = impl_->call(std::move(req), timeout, clamp_timeout(timeout), 8);
  std::int64_t value = 0;
  proto::decode_i64(resp.value, &value);
  return value;
}

bool TcpStore::check(const std::string& key, Millis timeout) {
  check_key(key);
  proto::Request req;
  req.op = proto::Op::kCheck;
  req.keys = {key};
  auto resp = impl_->call(std::move(req), timeout, clamp_timeout(timeout), 1);
  return resp.value[0] != '\0';
}

}  // namespace weightcast::comm
