// C10dStore: one connection, calls serialized by a timed mutex (waiting for it counts against the
// call's timeout). Every exchange is a request and, for most queries, a reply read under the
// call's deadline; any failure mid-exchange closes the connection (the byte stream may be out of
// step) and the next call reconnects, redoing VALIDATE and PING for 2.x.
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
#include <unistd.h>

#include <mutex>
#include <thread>

#include "comm/errors.h"
#include "comm/store/c10d_protocol.h"
#include "comm/store/c10d_store.h"
#include "comm/store/socket_io.h"

namespace weightcast::comm {

namespace proto = c10d_protocol;
using proto::Generation;
using proto::Query;

namespace {

constexpr Millis kProbeBudget{1000};
constexpr Millis kCancelBudget{5000};  // CANCEL_WAIT is answered at once by a live server
constexpr Millis kNamingBudget{1000};  // after a timeout, to find out which keys are missing
constexpr std::size_t kMaxKeysNamed = 64;
constexpr Millis kMaxBackoff{500};
const std::string kInitKey = "init/";

std::string wire_key(const std::string& key) {
  check_key(key);
  return "/" + key;  // torch's client prefixes every user key
}

proto::Request request(Query q, std::vector<std::string> keys = {},
                       std::vector<std::string> values = {}) {
  proto::Request r;
  r.query = q;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

}  // namespace

std::string_view to_string(C10dProtocol protocol) {
  switch (protocol) {
    case C10dProtocol::kAuto:
      return "auto";
    case C10dProtocol::kTorch1:
      return "torch1";
    case C10dProtocol::kTorch2:
      return "torch2";
  }
  return "unknown";
}

struct C10dStore::Impl {
  C10dStoreOptions opts;
  std::string peer;
  std::timed_mutex mu;
  net::Fd fd;  // invalid: reconnect before the next call
  std::optional<Generation> gen;

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
  void send(const proto::Request& req, Deadline deadline) {
    const auto r = net::send_all(fd.get(), proto::encode_request(*gen, req), deadline);
    if (!r.ok()) io_failed(r, proto::query_name(req.query));
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
    return proto::read_i64(b);
  }
  std::string recv_bytes(Deadline deadline, const char* what);
  std::int64_t exchange_i64(const proto::Request& req, Deadline deadline) {
    send(req, deadline);
    return recv_i64(deadline, proto::query_name(req.query));
  }

  // WAIT on wire keys; false when the deadline passed first (the connection stays usable for
  // 2.x, which cancels; a 1.x one is closed, since its STOP_WAITING may still come).
  bool wait_wire(const std::vector<std::string>& keys, Deadline deadline);
  [[noreturn]] void wait_timed_out(const std::vector<std::string>& user_keys, Millis timeout);
  std::vector<std::string> missing(const std::vector<std::string>& user_keys);
  void require_torch2(const char* what) const {
    if (gen != Generation::kTorch2) {
      throw ConfigError(detail::concat("c10d store ", what, " needs the torch 2.x protocol; ", peer,
                                       " is spoken to as torch 1.x"));
    }
  }
};

C10dStore::C10dStore(C10dStoreOptions opts) : impl_(std::make_unique<Impl>()) {
  if (opts.port == 0) throw ConfigError("c10d store client needs a port (got 0)");
  if (opts.protocol == C10dProtocol::kTorch1) impl_->gen = Generation::kTorch1;
  if (opts.protocol == C10dProtocol::kTorch2) impl_->gen = Generation::kTorch2;
  impl_->opts = std::move(opts);
  impl_->peer = net::endpoint(impl_->opts.host, impl_->opts.port);
  impl_->connect(deadline_after(impl_->opts.connect_timeout), /*retry=*/true);
}

C10dStore::~C10dStore() = default;

C10dProtocol C10dStore::protocol() const {
  return impl_->gen == Generation::kTorch1 ? C10dProtocol::kTorch1 : C10dProtocol::kTorch2;
}

std::size_t C10dStore::max_value_bytes() const {
  return impl_->opts.max_value_bytes;
}

void C10dStore::Impl::connect(Deadline deadline, bool retry) {
  Millis backoff{10};
  std::string why = "no attempt finished";
  while (true) {
    bool timed_out = false;
    std::string attempt;
    net::Fd conn = net::connect_once(opts.host, opts.port, deadline, &attempt, &timed_out);
    if (conn && try_generation(conn, deadline, &attempt)) {
      fd = std::move(conn);
      return;
    }
    why = attempt;
    if (!retry) {
      throw PeerError(peer, detail::concat("cannot reconnect to the c10d store: ", why));
    }
    if (expired(deadline)) {
      throw TimeoutError(detail::concat("could not connect to the c10d store at ", peer, " within ",
                                        opts.connect_timeout.count(), " ms: ", why));
    }
    std::this_thread::sleep_for(std::min(backoff, remaining(deadline)));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

// Readies a fresh connection for the generation in use, resolving it first under kAuto (see the
// file comment). May replace `conn` by a second connection.
bool C10dStore::Impl::try_generation(net::Fd& conn, Deadline deadline, std::string* why) {
  if (gen == Generation::kTorch1) return true;
  if (gen == Generation::kTorch2) return handshake_torch2(conn.get(), deadline, why);
  bool definitive = false;
  if (probe_torch1(conn.get(), std::min(deadline, deadline_after(kProbeBudget)), &definitive)) {
    gen = Generation::kTorch1;
    return true;
  }
  bool timed_out = false;
  conn = net::connect_once(opts.host, opts.port, deadline, why, &timed_out);
  if (!conn || !handshake_torch2(conn.get(), deadline, why)) {
    if (!definitive) *why += " (and no torch 1.x answer to GETNUMKEYS either)";
    return false;
  }
  gen = Generation::kTorch2;
  return true;
}

bool C10dStore::Impl::probe_torch1(int conn, Deadline deadline, bool* definitive) {
  const std::string probe = proto::encode_request(Generation::kTorch1, request(Query::kGetNumKeys));
  char reply[8];
  *definitive = false;
  if (!net::send_all(conn, probe, deadline).ok()) return false;
  const auto r = net::recv_exact(conn, reply, sizeof(reply), deadline);
  *definitive = r.io == net::Io::kClosed;  // dropped: a 2.x legacy server
  return r.ok();
}

bool C10dStore::Impl::handshake_torch2(int conn, Deadline deadline, std::string* why) {
  proto::Request validate = request(Query::kValidate);
  validate.word = proto::kValidateMagic;
  proto::Request ping = request(Query::kPing);
  ping.word = static_cast<std::uint32_t>(::getpid());
  const std::string bytes = proto::encode_request(Generation::kTorch2, validate) +
                            proto::encode_request(Generation::kTorch2, ping);
  char echo[4];
  auto r = net::send_all(conn, bytes, deadline);
  if (r.ok()) r = net::recv_exact(conn, echo, sizeof(echo), deadline);
  if (!r.ok()) {
    *why = detail::concat("torch 2.x handshake (VALIDATE, PING): ", r.describe());
    return false;
  }
  if (proto::read_u32(echo) != ping.word) {
    throw PeerError(peer, detail::concat("c10d store PING echoed ", proto::read_u32(echo),
                                         " instead of ", ping.word, ": not a torch 2.x store"));
  }
  return true;
}

std::string C10dStore::Impl::recv_bytes(Deadline deadline, const char* what) {
  char header[8];
  recv(header, sizeof(header), deadline, what);
  const std::uint64_t n = proto::read_u64(header);
  if (n > opts.max_value_bytes) {
    throw PeerError(peer, detail::concat("c10d store reply to ", what, " claims ", n,
                                         " bytes, over the limit of ", opts.max_value_bytes));
  }
  std::string out;
  const auto r = net::recv_append(fd.get(), &out, static_cast<std::size_t>(n), deadline);
  if (!r.ok()) io_failed(r, what);
  return out;
}

bool C10dStore::Impl::wait_wire(const std::vector<std::string>& keys, Deadline deadline) {
  send(request(Query::kWait, keys), deadline);
  char b = 0;
  const auto r = net::recv_exact(fd.get(), &b, 1, deadline);
  if (r.ok()) {
    if (b != proto::kStopWaiting) {
      throw PeerError(peer, detail::concat("c10d store WAIT answered ", static_cast<int>(b)));
    }
    return true;
  }
  if (r.io != net::Io::kTimeout) io_failed(r, "WAIT");
  if (gen == Generation::kTorch1) {
    fd.reset();  // 1.x cannot cancel: a STOP_WAITING may still arrive on this connection
    return false;
  }
  const Deadline cancel_deadline = deadline_after(kCancelBudget);
  send(request(Query::kCancelWait), cancel_deadline);
  std::uint8_t reply = recv_u8(cancel_deadline, "CANCEL_WAIT");
  const bool raced = reply == proto::kStopWaiting;  // the keys came just before the cancel
  if (raced) reply = recv_u8(cancel_deadline, "CANCEL_WAIT");
  if (reply != proto::kWaitCanceled) {
    throw PeerError(peer, detail::concat("c10d store CANCEL_WAIT answered ",
                                         static_cast<int>(reply), ", not WAIT_CANCELED"));
  }
  return raced;
}

// Which of `user_keys` are missing, asked one CHECK each on a connection in step (reconnecting
// if needed), within kNamingBudget; all of them when that fails.
std::vector<std::string> C10dStore::Impl::missing(const std::vector<std::string>& user_keys) {
  if (user_keys.size() == 1 || user_keys.size() > kMaxKeysNamed) return user_keys;
  const Deadline deadline = deadline_after(kNamingBudget);
  std::vector<std::string> out;
  try {
    if (!fd) connect(deadline, /*retry=*/false);
    for (const auto& k : user_keys) {
      send(request(Query::kCheck, {"/" + k}), deadline);
      if (recv_u8(deadline, "CHECK") != proto::kCheckReady) out.push_back(k);
    }
  } catch (const Error&) {
    fd.reset();
    return user_keys;
  }
  return out.empty() ? user_keys : out;
}

void C10dStore::Impl::wait_timed_out(const std::vector<std::string>& user_keys, Millis timeout) {
  throw TimeoutError(detail::concat("c10d store at ", peer, ": key(s) ", join(missing(user_keys)),
                                    " not set within ", timeout.count(), " ms"));
}

std::int64_t C10dStore::join_as_worker(Millis timeout) {
  return impl_->run(timeout, "ADD", [&](Deadline d) {
    proto::Request req = request(Query::kAdd, {kInitKey});
    req.delta = 1;
    return impl_->exchange_i64(req, d);
  });
}

void C10dStore::set(const std::string& key, std::string_view value, Millis timeout) {
  auto req = request(Query::kSet, {wire_key(key)}, {std::string(value)});
  check_value(value, impl_->opts.max_value_bytes);
  impl_->run(timeout, "SET", [&](Deadline d) { impl_->send(req, d); });
}

std::string C10dStore::get(const std::string& key, Millis timeout) {
  const std::string wire = wire_key(key);
  return impl_->run(timeout, "GET", [&](Deadline d) {
    if (!impl_->wait_wire({wire}, d)) impl_->wait_timed_out({key}, timeout);
    impl_->send(request(Query::kGet, {wire}), deadline_after(kCancelBudget));
    return impl_->recv_bytes(deadline_after(kCancelBudget), "GET");
  });
}

void C10dStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> wire;
  for (const auto& k : keys) wire.push_back(wire_key(k));
  if (wire.empty()) return;
  impl_->run(timeout, "WAIT", [&](Deadline d) {
    if (!impl_->wait_wire(wire, d)) impl_->wait_timed_out(keys, timeout);
  });
}

std::int64_t C10dStore::add(const std::string& key, std::int64_t delta, Millis timeout) {
  proto::Request req = request(Query::kAdd, {wire_key(key)});
  req.delta = delta;
  return impl_->run(timeout, "ADD", [&](Deadline d) { return impl_->exchange_i64(req, d); });
}

bool C10dStore::check(const std::string& key, Millis timeout) {
  const auto req = request(Query::kCheck, {wire_key(key)});
  return impl_->run(timeout, "CHECK", [&](Deadline d) {
    impl_->send(req, d);
    const std::uint8_t b = impl_->recv_u8(d, "CHECK");
    if (b != proto::kCheckReady && b != proto::kCheckNotReady) {
      throw PeerError(impl_->peer, detail::concat("c10d store CHECK answered ", int{b}));
    }
    return b == proto::kCheckReady;
  });
}

std::string C10dStore::compare_set(const std::string& key, std::string_view expected,
                                   std::string_view desired, Millis timeout) {
  check_value(expected, impl_->opts.max_value_bytes);
  check_value(desired, impl_->opts.max_value_bytes);
  const auto req =
      request(Query::kCompareSet, {wire_key(key)}, {std::string(expected), std::string(desired)});
  return impl_->run(timeout, "COMPARE_SET", [&](Deadline d) {
    impl_->send(req, d);
    return impl_->recv_bytes(d, "COMPARE_SET");
  });
}

bool C10dStore::delete_key(const std::string& key, Millis timeout) {
  const auto req = request(Query::kDeleteKey, {wire_key(key)});
  return impl_->run(timeout, "DELETE_KEY",
                    [&](Deadline d) { return impl_->exchange_i64(req, d) == 1; });
}

std::int64_t C10dStore::num_keys(Millis timeout) {
  return impl_->run(timeout, "GETNUMKEYS", [&](Deadline d) {
    return impl_->exchange_i64(request(Query::kGetNumKeys), d);
  });
}

void C10dStore::append(const std::string& key, std::string_view value, Millis timeout) {
  impl_->require_torch2("APPEND");
  check_value(value, impl_->opts.max_value_bytes);
  const auto req = request(Query::kAppend, {wire_key(key)}, {std::string(value)});
  impl_->run(timeout, "APPEND", [&](Deadline d) { impl_->send(req, d); });
}

std::vector<std::string> C10dStore::multi_get(const std::vector<std::string>& keys,
                                              Millis timeout) {
  impl_->require_torch2("MULTI_GET");
  std::vector<std::string> wire;
  for (const auto& k : keys) wire.push_back(wire_key(k));
  if (wire.empty()) return {};
  return impl_->run(timeout, "MULTI_GET", [&](Deadline d) {
    if (!impl_->wait_wire(wire, d)) impl_->wait_timed_out(keys, timeout);  // as torch's multiGet
    const Deadline io = deadline_after(kCancelBudget);
    impl_->send(request(Query::kMultiGet, wire), io);
    std::vector<std::string> out;
    for (std::size_t i = 0; i < wire.size(); ++i) out.push_back(impl_->recv_bytes(io, "MULTI_GET"));
    return out;
  });
}

void C10dStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values, Millis timeout) {
  impl_->require_torch2("MULTI_SET");
  WC_ENFORCE_EQ(keys.size(), values.size(), "multi_set needs one value per key");
  std::vector<std::string> wire;
  for (const auto& k : keys) wire.push_back(wire_key(k));
  for (const auto& v : values) check_value(v, impl_->opts.max_value_bytes);
  if (wire.empty()) return;
  const auto req = request(Query::kMultiSet, std::move(wire), values);
  impl_->run(timeout, "MULTI_SET", [&](Deadline d) { impl_->send(req, d); });
}

}  // namespace weightcast::comm
