// C10dStore: calls serialized on one C10dConnection (comm/store/c10d_connection.h). Each call
// checks its arguments, then sends its request (and reads the reply) under its timeout through
// C10dConnection::run.
#include "comm/store/c10d_store.h"

#include <string>
#include <vector>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "comm/store/c10d_connection.h"

namespace weightcast::comm {

namespace proto = c10d_protocol;
using c10d_client::kCancelBudget;
using c10d_client::request;
using proto::Query;

namespace {

const std::string kInitKey = "init/";

std::string wire_key(const std::string& key) {
  check_key(key);
  return "/" + key;  // torch's client prefixes every user key
}

}  // namespace

std::string_view to_string(C10dProtocol protocol) {
  static constexpr auto kNames =
      enum_names<C10dProtocol>("c10d protocol", {{C10dProtocol::kAuto, "auto"},
                                                 {C10dProtocol::kTorch1, "torch1"},
                                                 {C10dProtocol::kTorch2, "torch2"}});
  return kNames.name_or(protocol, "unknown");
}

C10dStore::C10dStore(C10dStoreOptions opts)
    : conn_(std::make_unique<C10dConnection>(std::move(opts))) {}

C10dStore::~C10dStore() = default;

C10dProtocol C10dStore::protocol() const {
  return conn_->protocol();
}

std::size_t C10dStore::max_value_bytes() const {
  return conn_->options().max_value_bytes;
}

std::int64_t C10dStore::join_as_worker(Millis timeout) {
  return conn_->run(timeout, "ADD", [&](Deadline d) {
    proto::Request req = request(Query::kAdd, {kInitKey});
    req.delta = 1;
    return conn_->exchange_i64(req, d);
  });
}

void C10dStore::set(const std::string& key, std::string_view value, Millis timeout) {
  auto req = request(Query::kSet, {wire_key(key)}, {std::string(value)});
  check_value(value, conn_->options().max_value_bytes);
  conn_->run(timeout, "SET", [&](Deadline d) { conn_->send(req, d); });
}

std::string C10dStore::get(const std::string& key, Millis timeout) {
  const std::string wire = wire_key(key);
  return conn_->run(timeout, "GET", [&](Deadline d) {
    if (!conn_->wait_wire({wire}, d)) conn_->wait_timed_out({key}, timeout);
    conn_->send(request(Query::kGet, {wire}), deadline_after(kCancelBudget));
    return conn_->recv_bytes(deadline_after(kCancelBudget), "GET");
  });
}

void C10dStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> wire;
  for (const auto& k : keys) wire.push_back(wire_key(k));
  if (wire.empty()) return;
  conn_->run(timeout, "WAIT", [&](Deadline d) {
    if (!conn_->wait_wire(wire, d)) conn_->wait_timed_out(keys, timeout);
  });
}

std::int64_t C10dStore::add(const std::string& key, std::int64_t delta, Millis timeout) {
  proto::Request req = request(Query::kAdd, {wire_key(key)});
  req.delta = delta;
  return conn_->run(timeout, "ADD", [&](Deadline d) { return conn_->exchange_i64(req, d); });
}

bool C10dStore::check(const std::string& key, Millis timeout) {
  const auto req = request(Query::kCheck, {wire_key(key)});
  return conn_->run(timeout, "CHECK", [&](Deadline d) {
    conn_->send(req, d);
    const std::uint8_t b = conn_->recv_u8(d, "CHECK");
    if (b != proto::kCheckReady && b != proto::kCheckNotReady) {
      throw PeerError(conn_->peer(), detail::concat("c10d store CHECK answered ", int{b}));
    }
    return b == proto::kCheckReady;
  });
}

std::string C10dStore::compare_set(const std::string& key, std::string_view expected,
                                   std::string_view desired, Millis timeout) {
  check_value(expected, conn_->options().max_value_bytes);
  check_value(desired, conn_->options().max_value_bytes);
  const auto req =
      request(Query::kCompareSet, {wire_key(key)}, {std::string(expected), std::string(desired)});
  return conn_->run(timeout, "COMPARE_SET", [&](Deadline d) {
    conn_->send(req, d);
    return conn_->recv_bytes(d, "COMPARE_SET");
  });
}

bool C10dStore::delete_key(const std::string& key, Millis timeout) {
  const auto req = request(Query::kDeleteKey, {wire_key(key)});
  return conn_->run(timeout, "DELETE_KEY",
                    [&](Deadline d) { return conn_->exchange_i64(req, d) == 1; });
}

std::int64_t C10dStore::num_keys(Millis timeout) {
  return conn_->run(timeout, "GETNUMKEYS", [&](Deadline d) {
    return conn_->exchange_i64(request(Query::kGetNumKeys), d);
  });
}

void C10dStore::append(const std::string& key, std::string_view value, Millis timeout) {
  conn_->require_torch2("APPEND");
  check_value(value, conn_->options().max_value_bytes);
  const auto req = request(Query::kAppend, {wire_key(key)}, {std::string(value)});
  conn_->run(timeout, "APPEND", [&](Deadline d) { conn_->send(req, d); });
}

std::vector<std::string> C10dStore::multi_get(const std::vector<std::string>& keys,
                                              Millis timeout) {
  conn_->require_torch2("MULTI_GET");
  std::vector<std::string> wire;
  for (const auto& k : keys) wire.push_back(wire_key(k));
  if (wire.empty()) return {};
  return conn_->run(timeout, "MULTI_GET", [&](Deadline d) {
    if (!conn_->wait_wire(wire, d)) conn_->wait_timed_out(keys, timeout);  // as torch's multiGet
    const Deadline io = deadline_after(kCancelBudget);
    conn_->send(request(Query::kMultiGet, wire), io);
    std::vector<std::string> out;
    for (std::size_t i = 0; i < wire.size(); ++i) out.push_back(conn_->recv_bytes(io, "MULTI_GET"));
    return out;
  });
}

void C10dStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values, Millis timeout) {
  conn_->require_torch2("MULTI_SET");
  WC_ENFORCE_EQ(keys.size(), values.size(), "multi_set needs one value per key");
  std::vector<std::string> wire;
  for (const auto& k : keys) wire.push_back(wire_key(k));
  for (const auto& v : values) check_value(v, conn_->options().max_value_bytes);
  if (wire.empty()) return;
  const auto req = request(Query::kMultiSet, std::move(wire), values);
  conn_->run(timeout, "MULTI_SET", [&](Deadline d) { conn_->send(req, d); });
}

}  // namespace weightcast::comm
