// C10dConnection (comm/store/c10d_connection.h): connecting, protocol detection and the
// exchanges every C10dStore call is made of.
#include "comm/store/c10d_connection.h"

#include <unistd.h>

#include <mutex>

#include "comm/errors.h"
#include "comm/store/c10d_protocol.h"
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

C10dConnection::C10dConnection(C10dStoreOptions opts) : opts_(std::move(opts)) {
  if (opts_.port == 0) throw ConfigError("c10d store client needs a port (got 0)");
  if (opts_.protocol == C10dProtocol::kTorch1) gen_ = Generation::kTorch1;
  if (opts_.protocol == C10dProtocol::kTorch2) gen_ = Generation::kTorch2;
  peer_ = net::endpoint(opts_.host, opts_.port);
  connect(deadline_after(opts_.connect_timeout), /*retry=*/true);
}

C10dProtocol C10dConnection::protocol() const {
  return gen_ == Generation::kTorch1 ? C10dProtocol::kTorch1 : C10dProtocol::kTorch2;
}

void C10dConnection::connect(Deadline deadline, bool retry) {
  net::ConnectRetry pacing(peer_, "c10d store", "c10d store", opts_.connect_timeout, deadline,
                           retry);
  while (true) {
    bool timed_out = false;
    std::string attempt;
    net::Fd conn = net::connect_once(opts_.host, opts_.port, deadline, &attempt, &timed_out);
    if (conn && try_generation(conn, deadline, &attempt)) {
      fd_ = std::move(conn);
      return;
    }
    pacing.failed(attempt);
  }
}

// Readies a fresh connection for the generation in use, resolving it first under kAuto (see the
// file comment). May replace `conn` by a second connection.
bool C10dConnection::try_generation(net::Fd& conn, Deadline deadline, std::string* why) {
  if (gen_ == Generation::kTorch1) return true;
  if (gen_ == Generation::kTorch2) return handshake_torch2(conn.get(), deadline, why);
  bool definitive = false;
  if (probe_torch1(conn.get(), std::min(deadline, deadline_after(kProbeBudget)), &definitive)) {
    gen_ = Generation::kTorch1;
    return true;
  }
  bool timed_out = false;
  conn = net::connect_once(opts_.host, opts_.port, deadline, why, &timed_out);
  if (!conn || !handshake_torch2(conn.get(), deadline, why)) {
    if (!definitive) *why += " (and no torch 1.x answer to GETNUMKEYS either)";
    return false;
  }
  gen_ = Generation::kTorch2;
  return true;
}

bool C10dConnection::probe_torch1(int conn, Deadline deadline, bool* definitive) {
  const std::string probe = proto::encode_request(Generation::kTorch1, request(Query::kGetNumKeys));
  char reply[8];
  *definitive = false;
  if (!net::send_all(conn, probe, deadline).ok()) return false;
  const auto r = net::recv_exact(conn, reply, sizeof(reply), deadline);
  *definitive = r.io == net::Io::kClosed;  // dropped: a 2.x legacy server
  return r.ok();
}

bool C10dConnection::handshake_torch2(int conn, Deadline deadline, std::string* why) {
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
    throw PeerError(peer_, detail::concat("c10d store PING echoed ", proto::read_u32(echo),
                                          " instead of ", ping.word, ": not a torch 2.x store"));
  }
  return true;
}

std::string C10dConnection::recv_bytes(Deadline deadline, const char* what) {
  char header[8];
  recv(header, sizeof(header), deadline, what);
  const std::uint64_t n = proto::read_u64(header);
  if (n > opts_.max_value_bytes) {
    throw PeerError(peer_, detail::concat("c10d store reply to ", what, " claims ", n,
                                          " bytes, over the limit of ", opts_.max_value_bytes));
  }
  std::string out;
  const auto r = net::recv_append(fd_.get(), &out, static_cast<std::size_t>(n), deadline);
  if (!r.ok()) io_failed(r, what);
  return out;
}

bool C10dConnection::wait_wire(const std::vector<std::string>& keys, Deadline deadline) {
  send(request(Query::kWait, keys), deadline);
  char b = 0;
  const auto r = net::recv_exact(fd_.get(), &b, 1, deadline);
  if (r.ok()) {
    if (b != proto::kStopWaiting) {
      throw PeerError(peer_, detail::concat("c10d store WAIT answered ", static_cast<int>(b)));
    }
    return true;
  }
  if (r.io != net::Io::kTimeout) io_failed(r, "WAIT");
  if (gen_ == Generation::kTorch1) {
    fd_.reset();  // 1.x cannot cancel: a STOP_WAITING may still arrive on this connection
    return false;
  }
  const Deadline cancel_deadline = deadline_after(kCancelBudget);
  send(request(Query::kCancelWait), cancel_deadline);
  std::uint8_t reply = recv_u8(cancel_deadline, "CANCEL_WAIT");
  const bool raced = reply == proto::kStopWaiting;  // the keys came just before the cancel
  if (raced) reply = recv_u8(cancel_deadline, "CANCEL_WAIT");
  if (reply != proto::kWaitCanceled) {
    throw PeerError(peer_, detail::concat("c10d store CANCEL_WAIT answered ",
                                          static_cast<int>(reply), ", not WAIT_CANCELED"));
  }
  return raced;
}

// Which of `user_keys` are missing, asked one CHECK each on a connection in step (reconnecting
// if needed), within kNamingBudget; all of them when that fails.
std::vector<std::string> C10dConnection::missing(const std::vector<std::string>& user_keys) {
  if (user_keys.size() == 1 || user_keys.size() > kMaxKeysNamed) return user_keys;
  const Deadline deadline = deadline_after(kNamingBudget);
  std::vector<std::string> out;
  try {
    if (!fd_) connect(deadline, /*retry=*/false);
    for (const auto& k : user_keys) {
      send(request(Query::kCheck, {"/" + k}), deadline);
      if (recv_u8(deadline, "CHECK") != proto::kCheckReady) out.push_back(k);
    }
  } catch (const Error&) {
    fd_.reset();
    return user_keys;
  }
  return out.empty() ? user_keys : out;
}

void C10dConnection::wait_timed_out(const std::vector<std::string>& user_keys, Millis timeout) {
  throw TimeoutError(detail::concat("c10d store at ", peer_, ": key(s) ", join(missing(user_keys)),
                                    " not set within ", timeout.count(), " ms"));
}

}  // namespace weightcast::comm
