// C10dStore's Store calls: each checks its arguments, then sends its request (and reads the
// reply) under its timeout through Impl::run (c10d_store_impl.h).
#include <string>
#include <vector>

#include "comm/store/c10d_store_impl.h"

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
