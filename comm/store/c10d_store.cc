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

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "comm/store/c10d_protocol.h"
#include "comm/store/c10d_store.h"
#include "comm/store/c10d_store_impl.h"
#include "comm/transport/socket_io.h"

namespace weightcast::comm {

namespace proto = c10d_protocol;
using c10d_client::kCancelBudget;
using c10d_client::request;
using proto::Generation;
using proto::Query;

namespace {

constexpr Millis kProbeBudget{1000};
constexpr Millis kNamingBudget{1000};  // after a timeout, to find out which keys are missing
constexpr std::size_t kMaxKeysNamed = 64;

std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

}  // namespace

proto::Request c10d_client::request(Query q, std::vector<std::string> keys,
                                    std::vector<std::string> values) {
  proto::Request r;
  r.query = q;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

std::string_view to_string(C10dProtocol protocol) {
  static constexpr auto kNames =
      enum_names<C10dProtocol>("c10d protocol", {{C10dProtocol::kAuto, "auto"},
                                                 {C10dProtocol::kTorch1, "torch1"},
                                                 {C10dProtocol::kTorch2, "torch2"}});
  return kNames.name_or(protocol, "unknown");
}

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
  net::ConnectRetry pacing(peer, "c10d store", "c10d store", opts.connect_timeout, deadline, retry);
  while (true) {
    bool timed_out = false;
    std::string attempt;
    net::Fd conn = net::connect_once(opts.host, opts.port, deadline, &attempt, &timed_out);
    if (conn && try_generation(conn, deadline, &attempt)) {
      fd = std::move(conn);
      return;
    }
    pacing.failed(attempt);
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

}  // namespace weightcast::comm
