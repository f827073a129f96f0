// TcpStoreServer: a ConnectionServer (connection_server.h: acceptor, one thread per connection,
// reaping, stop) serving the store protocol. Each connection thread reads a frame, answers it and
// loops; blocking GET/WAIT wait on the data condition variable in short slices so they notice
// stop() and a client that hung up. Every change of a value is charged to a StoreQuota first, so
// the data never passes max_store_bytes or max_keys.
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "comm/errors.h"
#include "comm/store/connection_server.h"
#include "comm/store/counter.h"
#include "comm/store/store_protocol.h"
#include "comm/store/store_quota.h"
#include "comm/store/tcp_store.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace proto = store_protocol;

namespace {

constexpr Millis kCloseLinger{200};
constexpr Millis kPeerCheckSlice{100};

}  // namespace

struct TcpStoreServer::Impl {
  explicit Impl(TcpStoreServerOptions o)
      : opts(std::move(o)), quota(opts.max_store_bytes, opts.max_keys) {}

  TcpStoreServerOptions opts;
  proto::Limits limits;
  const std::atomic<bool>* stopping = nullptr;  // the connection server's stop flag

  std::mutex data_mu;
  std::condition_variable data_cv;
  std::map<std::string, std::string, std::less<>> data;
  StoreQuota quota;  // of `data`, under data_mu

  std::atomic<std::uint64_t> rejected_frames{0}, auth_failures{0}, dropped_stalled{0},
      dropped_over_cap{0};

  // Charges `key` going to `value_bytes` (under data_mu); StoreFullError past a cap.
  void charge(const std::string& key, std::size_t value_bytes) {
    auto it = data.find(key);
    quota.charge(key, it == data.end() ? std::nullopt : std::optional(it->second.size()),
                 value_bytes);
  }
  proto::Response over_cap(int fd, const proto::Request& req, const std::string& why) {
    ++dropped_over_cap;
    std::fprintf(stderr, "weightcast: store server refuses %s from %s: %s\n",
                 std::string(proto::op_name(req.op)).c_str(), net::peer_name(fd).c_str(),
                 why.c_str());
    return {proto::Status::kTooLarge, why, {}};
  }

  void refuse_over_limit(int fd);
  void serve(int fd);
  // Reads one request frame; empty when the connection is to end (refused, stalled or closed).
  // Before HELLO (`authed` false) only a frame the size of a HELLO is read.
  std::optional<proto::Request> read_request(int fd, bool greeted, bool authed);
  // Checks HELLO's protocol and token and acknowledges it; false ends the connection.
  bool hello(int fd, const proto::Request& req);
  // Answers an authenticated request; false ends the connection.
  bool answer(int fd, const proto::Request& req);
  // Replies with an error and ends the connection; the drain keeps the reply from being lost.
  void refuse(int fd, proto::Status status, std::string message) {
    send(fd, {status, std::move(message), {}});
    net::shutdown_and_drain(fd, kCloseLinger, stopping);
  }
  // Answers `req`; sets *drop when the connection must be abandoned without a reply.
  proto::Response handle(const proto::Request& req, int fd, bool* drop);
  proto::Response wait_for(const std::vector<std::string>& keys, std::uint32_t timeout_ms, int fd,
                           bool* drop);
  bool send(int fd, const proto::Response& r) {
    auto frame = proto::encode_response(r);
    return net::send_all(fd, frame, deadline_after(opts.io_timeout), stopping).ok();
  }
};

namespace {

TcpStoreServerOptions checked(TcpStoreServerOptions opts) {
  if (opts.max_value_bytes > proto::kMaxValueBytesLimit) {
    throw ConfigError(detail::concat("store max_value_bytes ", opts.max_value_bytes,
                                     " exceeds the protocol limit of ",
                                     proto::kMaxValueBytesLimit));
  }
  if (opts.max_connections == 0) throw ConfigError("store max_connections must be positive");
  if (opts.token.size() > proto::kMaxTokenBytes) {
    throw ConfigError(detail::concat("store token of ", opts.token.size(),
                                     " bytes exceeds the limit of ", proto::kMaxTokenBytes));
  }
  if (opts.io_timeout <= Millis(0)) throw ConfigError("store io_timeout must be positive");
  return opts;
}

}  // namespace

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions opts)
    : impl_(std::make_unique<Impl>(checked(std::move(opts)))) {
  auto& s = *impl_;
  s.limits.max_value_bytes = s.opts.max_value_bytes;
  // Taking data_mu after the stop flag is set orders it before any waiter's predicate check: a
  // waiter either sees the flag or is already waiting when notify_all() runs.
  ConnectionServer& server =
      listen({s.opts.bind_address, s.opts.port, s.opts.max_connections, "store server"}, [&s] {
        { std::lock_guard lock(s.data_mu); }
        s.data_cv.notify_all();
      });
  s.stopping = &server.stopping();
  server.start([&s](int fd) { s.serve(fd); }, [&s](int fd) { s.refuse_over_limit(fd); });
}

TcpStoreServer::~TcpStoreServer() {
  stop();
}

TcpStoreServerStats TcpStoreServer::stats() const {
  const auto& s = *impl_;
  const ConnectionCounts c = connections().counts();
  return {c.accepted,
          c.refused,
          c.active,
          s.rejected_frames.load(),
          s.auth_failures.load(),
          s.dropped_stalled.load(),
          s.dropped_over_cap.load()};
}

void TcpStoreServer::Impl::refuse_over_limit(int fd) {
  send(fd, {proto::Status::kUnavailable,
            detail::concat("store server at its limit of ", opts.max_connections, " connections"),
            {}});
  net::shutdown_and_drain(fd, Millis(50), stopping);
}

void TcpStoreServer::Impl::serve(int fd) {
  bool authed = opts.token.empty();
  bool greeted = false;  // until a first frame arrives, silence counts against io_timeout
  while (!stopping->load()) {
    const std::optional<proto::Request> req = read_request(fd, greeted, authed);
    if (!req) return;
    if (req->op == proto::Op::kHello) {
      if (!hello(fd, *req)) return;
      authed = true;
      greeted = true;
      continue;
    }
    if (!authed) {
      ++auth_failures;
      return refuse(fd, proto::Status::kUnauthorized, "unauthorized (missing token)");
    }
    greeted = true;
    if (!answer(fd, *req)) return;
  }
}

std::optional<proto::Request> TcpStoreServer::Impl::read_request(int fd, bool greeted,
                                                                 bool authed) {
  // A client that has spoken may idle between calls; a silent new one must not hold a slot.
  const Deadline idle = greeted ? Deadline::max() : deadline_after(opts.io_timeout);
  if (!net::wait_readable(fd, idle, stopping).ok()) return std::nullopt;
  const Deadline frame_deadline = deadline_after(opts.io_timeout);
  char header[proto::kFrameHeaderBytes];
  auto r = net::recv_exact(fd, header, sizeof(header), frame_deadline, stopping);
  if (r.io == net::Io::kTimeout) ++dropped_stalled;
  if (!r.ok()) return std::nullopt;
  const std::uint32_t length = proto::decode_frame_length({header, sizeof(header)});
  if (!authed && length > proto::kMaxHelloBodyBytes) {
    ++auth_failures;
    refuse(
        fd, proto::Status::kUnauthorized,
        detail::concat("unauthorized (missing token): a frame of ", length, " bytes before HELLO"));
    return std::nullopt;
  }
  if (auto check = proto::check_request_frame_length(length, limits); !check.ok()) {
    ++rejected_frames;
    refuse(fd, check.status, std::move(check.error));
    return std::nullopt;
  }
  std::string body;
  r = net::recv_append(fd, &body, length, frame_deadline, stopping);
  if (r.io == net::Io::kTimeout) ++dropped_stalled;
  if (!r.ok()) return std::nullopt;
  auto decoded = proto::decode_request_body(body, limits);
  if (!decoded.ok()) {
    ++rejected_frames;
    refuse(fd, decoded.status, std::move(decoded.error));
    return std::nullopt;
  }
  return std::move(decoded.value);
}

bool TcpStoreServer::Impl::hello(int fd, const proto::Request& req) {
  if (req.keys[0] != proto::kProtocolName) {
    ++rejected_frames;
    refuse(
        fd, proto::Status::kBadRequest,
        detail::concat("HELLO: protocol '", req.keys[0], "' is not '", proto::kProtocolName, "'"));
    return false;
  }
  if (!opts.token.empty()) {
    if (req.value.empty()) {
      ++auth_failures;
      refuse(fd, proto::Status::kUnauthorized, "unauthorized (missing token)");
      return false;
    }
    if (!proto::constant_time_equal(req.value, opts.token)) {
      ++auth_failures;
      refuse(fd, proto::Status::kForbidden, "forbidden (wrong token)");
      return false;
    }
  }
  return send(fd, {});
}

bool TcpStoreServer::Impl::answer(int fd, const proto::Request& req) {
  bool drop = false;
  proto::Response resp = handle(req, fd, &drop);
  if (drop) return false;
  if (!send(fd, resp)) return false;
  if (!proto::keeps_connection(resp.status)) {
    net::shutdown_and_drain(fd, kCloseLinger, stopping);
    return false;
  }
  return true;
}

proto::Response TcpStoreServer::Impl::handle(const proto::Request& req, int fd, bool* drop) {
  using proto::Op;
  using proto::Status;
  const std::string& key = req.keys.front();
  switch (req.op) {
    case Op::kSet: {
      try {
        std::lock_guard lock(data_mu);
        charge(key, req.value.size());
        data.insert_or_assign(key, req.value);
      } catch (const StoreFullError& e) {
        return over_cap(fd, req, e.what());
      }
      data_cv.notify_all();
      return {};
    }
    case Op::kGet: {
      auto resp = wait_for(req.keys, req.timeout_ms, fd, drop);
      if (resp.status == Status::kOk && !*drop) {
        std::lock_guard lock(data_mu);
        resp.value = data.at(key);  // keys are never erased, so it is still there
      }
      return resp;
    }
    case Op::kWait:
      return wait_for(req.keys, req.timeout_ms, fd, drop);
    case Op::kAdd: {
      std::int64_t delta = 0;
      proto::decode_i64(req.value, &delta);  // the decoder checked the size
      std::int64_t value = 0;
      try {
        std::lock_guard lock(data_mu);
        auto it = data.find(key);
        if (it != data.end()) value = decode_counter(key, it->second);
        value = add_counter(key, value, delta);
        std::string text = encode_counter(value);
        try {
          charge(key, text.size());
        } catch (const StoreFullError& full) {
          return over_cap(fd, req, full.what());
        }
        data.insert_or_assign(key, std::move(text));
      } catch (const BadRequestError& e) {
        return {Status::kRejected, e.what(), {}};
      }
      data_cv.notify_all();
      return {Status::kOk, {}, proto::encode_i64(value)};
    }
    case Op::kCheck: {
      std::lock_guard lock(data_mu);
      return {Status::kOk, {}, std::string(1, data.count(key) ? '\1' : '\0')};
    }
    case Op::kHello:
      break;
  }
  return {Status::kBadRequest, "unexpected op", {}};
}

proto::Response TcpStoreServer::Impl::wait_for(const std::vector<std::string>& keys,
                                               std::uint32_t timeout_ms, int fd, bool* drop) {
  const Deadline deadline = deadline_after(Millis(timeout_ms));
  std::unique_lock lock(data_mu);
  while (true) {
    if (stopping->load()) {
      *drop = true;
      return {};
    }
    std::string missing;
    for (const auto& k : keys) {
      if (data.find(k) == data.end()) {
        if (missing.size() > proto::kMaxMessageBytes) {
          missing += ", ...";
          break;
        }
        missing += (missing.empty() ? "" : ", ") + k;
      }
    }
    if (missing.empty()) return {};
    if (expired(deadline)) {
      return {proto::Status::kTimeout,
              detail::concat("timed out after ", timeout_ms, " ms; missing keys: ", missing),
              {}};
    }
    const Deadline slice = std::min(deadline, deadline_after(kPeerCheckSlice));
    if (data_cv.wait_until(lock, slice) == std::cv_status::timeout && net::peer_hung_up(fd)) {
      *drop = true;  // the client gave up: free this thread instead of waiting out the timeout
      return {};
    }
  }
}

}  // namespace weightcast::comm
