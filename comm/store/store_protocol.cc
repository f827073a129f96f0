#include "comm/store/store_protocol.h"

#include <algorithm>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "comm/store.h"

namespace weightcast::comm::store_protocol {

namespace {

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

void put_str(std::string& out, std::string_view s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out.append(s);
}

// Prepends the body length; callers reserve the header bytes up front.
std::string finish_frame(std::string frame) {
  const auto body = frame.size() - kFrameHeaderBytes;
  WC_ENFORCE_LE(body, std::size_t{UINT32_MAX}, "store frame too long to encode");
  for (std::size_t i = 0; i < 4; ++i) {
    frame[i] = static_cast<char>((body >> (8 * i)) & 0xffu);
  }
  return frame;
}

// Bounds-checked cursor over a body. Every read checks the bytes left first, and strings check
// their claimed length against a limit before anything is allocated for them.
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}

  bool u8(std::uint8_t* out) {
    if (rest_.empty()) return false;
    *out = static_cast<std::uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return true;
  }

  bool u32(std::uint32_t* out) {
    if (rest_.size() < 4) return false;
    *out = decode_frame_length(rest_);
    rest_.remove_prefix(4);
    return true;
  }

  // kOk, kBadRequest (truncated) or kTooLarge (over `limit`); `field` names it in `error`.
  Status str(std::string* out, std::size_t limit, const char* field, std::string* error) {
    std::uint32_t n = 0;
    if (!u32(&n)) return truncated(field, error);
    if (n > limit) {
      *error = detail::concat(field, ": ", n, " bytes exceeds the limit of ", limit, " bytes");
      return Status::kTooLarge;
    }
    if (n > rest_.size()) return truncated(field, error);
    out->assign(rest_.data(), n);
    rest_.remove_prefix(n);
    return Status::kOk;
  }

  std::size_t left() const { return rest_.size(); }

  static Status truncated(const char* field, std::string* error) {
    *error = detail::concat(field, ": frame ends early");
    return Status::kBadRequest;
  }

 private:
  std::string_view rest_;
};

template <typename T>
Decoded<T> fail(Status status, std::string error) {
  Decoded<T> d;
  d.status = status;
  d.error = std::move(error);
  return d;
}

bool valid_op(std::uint8_t op) {
  return op >= static_cast<std::uint8_t>(Op::kHello) && op <= static_cast<std::uint8_t>(Op::kCheck);
}

// Per-op shape: how many keys and whether a value may be present.
std::string check_shape(const Request& r) {
  const std::size_t n = r.keys.size();
  switch (r.op) {
    case Op::kHello:
      if (n != 1) return "HELLO: needs exactly one key (the protocol name)";
      return {};
    case Op::kWait:
      if (n == 0) return "WAIT: needs at least one key";
      if (!r.value.empty()) return "WAIT: must not carry a value";
      return {};
    case Op::kAdd:
      if (n != 1) return "ADD: needs exactly one key";
      if (r.value.size() != 8) return "ADD: value must be an 8-byte delta";
      return {};
    case Op::kSet:
      if (n != 1) return "SET: needs exactly one key";
      return {};
    case Op::kGet:
    case Op::kCheck:
      if (n != 1) return detail::concat(op_name(r.op), ": needs exactly one key");
      if (!r.value.empty()) return detail::concat(op_name(r.op), ": must not carry a value");
      return {};
  }
  return "unknown op";
}

}  // namespace

std::string_view op_name(Op op) {
  static constexpr auto kNames = enum_names<Op>("store op", {{Op::kHello, "HELLO"},
                                                             {Op::kSet, "SET"},
                                                             {Op::kGet, "GET"},
                                                             {Op::kWait, "WAIT"},
                                                             {Op::kAdd, "ADD"},
                                                             {Op::kCheck, "CHECK"}});
  return kNames.name_or(op, "UNKNOWN");
}

std::string_view status_name(Status status) {
  static constexpr auto kNames =
      enum_names<Status>("store status", {{Status::kOk, "ok"},
                                          {Status::kTimeout, "timeout"},
                                          {Status::kBadRequest, "bad request"},
                                          {Status::kUnauthorized, "unauthorized"},
                                          {Status::kTooLarge, "too large"},
                                          {Status::kForbidden, "forbidden"},
                                          {Status::kRejected, "rejected"},
                                          {Status::kUnavailable, "unavailable"}});
  return kNames.name_or(status, "unknown status");
}

bool keeps_connection(Status status) {
  return status == Status::kOk || status == Status::kTimeout || status == Status::kRejected;
}

std::string encode_request(const Request& r) {
  std::size_t size = kFrameHeaderBytes + 1 + 4 + 4 + 4 + r.value.size();
  for (const auto& k : r.keys) size += 4 + k.size();
  std::string out;
  out.reserve(size);
  out.resize(kFrameHeaderBytes);
  out.push_back(static_cast<char>(r.op));
  put_u32(out, r.timeout_ms);
  put_u32(out, static_cast<std::uint32_t>(r.keys.size()));
  for (const auto& k : r.keys) put_str(out, k);
  put_str(out, r.value);
  return finish_frame(std::move(out));
}

std::string encode_response(const Response& r) {
  std::string_view message = r.message;
  if (message.size() > kMaxMessageBytes) message = message.substr(0, kMaxMessageBytes);
  std::string out;
  out.reserve(kFrameHeaderBytes + 1 + 8 + message.size() + r.value.size());
  out.resize(kFrameHeaderBytes);
  out.push_back(static_cast<char>(r.status));
  put_str(out, message);
  put_str(out, r.value);
  return finish_frame(std::move(out));
}

std::uint32_t decode_frame_length(std::string_view header) {
  WC_ENFORCE_GE(header.size(), kFrameHeaderBytes, "store frame header is 4 bytes");
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(header[i]);
  return v;
}

std::size_t max_request_body_bytes(const Limits& limits) {
  return 1 + 4 + 4 + limits.max_keys * (4 + Store::kMaxKeyBytes) + 4 + limits.max_value_bytes;
}

std::size_t max_response_body_bytes(std::size_t max_value_bytes) {
  return 1 + 4 + kMaxMessageBytes + 4 + std::max<std::size_t>(max_value_bytes, 8);
}

Decoded<bool> check_request_frame_length(std::uint64_t length, const Limits& limits) {
  const auto max = max_request_body_bytes(limits);
  if (length > max) {
    return fail<bool>(Status::kTooLarge, detail::concat("request frame of ", length,
                                                        " bytes exceeds the limit of ", max));
  }
  return {};
}

Decoded<bool> check_response_frame_length(std::uint64_t length, std::size_t max_value_bytes) {
  const auto max = max_response_body_bytes(max_value_bytes);
  if (length > max) {
    return fail<bool>(Status::kTooLarge, detail::concat("response frame of ", length,
                                                        " bytes exceeds the limit of ", max));
  }
  return {};
}

Decoded<Request> decode_request_body(std::string_view body, const Limits& limits) {
  Reader in(body);
  Decoded<Request> d;
  Request& r = d.value;
  std::uint8_t op = 0;
  if (!in.u8(&op)) return fail<Request>(Status::kBadRequest, "op: frame is empty");
  if (!valid_op(op)) {
    return fail<Request>(Status::kBadRequest, detail::concat("op: unknown op ", int{op}));
  }
  r.op = static_cast<Op>(op);
  if (!in.u32(&r.timeout_ms))
    return fail<Request>(Status::kBadRequest, "timeout_ms: frame ends early");
  std::uint32_t count = 0;
  if (!in.u32(&count)) return fail<Request>(Status::kBadRequest, "key_count: frame ends early");
  if (count > limits.max_keys) {
    return fail<Request>(
        Status::kTooLarge,
        detail::concat("key_count: ", count, " keys exceeds the limit of ", limits.max_keys));
  }
  // Each key needs at least its 4-byte length: a count the body cannot hold is refused before
  // the vector is sized for it.
  if (count > in.left() / 4) return fail<Request>(Status::kBadRequest, "keys: frame ends early");
  r.keys.resize(count);
  for (auto& key : r.keys) {
    std::string error;
    auto st = in.str(&key, Store::kMaxKeyBytes, "key", &error);
    if (st != Status::kOk) return fail<Request>(st, std::move(error));
    if (key.empty()) return fail<Request>(Status::kBadRequest, "key: must not be empty");
  }
  std::string error;
  auto st = in.str(&r.value, limits.max_value_bytes, "value", &error);
  if (st != Status::kOk) return fail<Request>(st, std::move(error));
  if (in.left() != 0) {
    return fail<Request>(Status::kBadRequest,
                         detail::concat("frame: ", in.left(), " trailing bytes after value"));
  }
  if (auto shape = check_shape(r); !shape.empty()) {
    return fail<Request>(Status::kBadRequest, std::move(shape));
  }
  return d;
}

Decoded<Response> decode_response_body(std::string_view body, std::size_t max_value_bytes) {
  Reader in(body);
  Decoded<Response> d;
  std::uint8_t status = 0;
  if (!in.u8(&status)) return fail<Response>(Status::kBadRequest, "status: frame is empty");
  if (status > static_cast<std::uint8_t>(Status::kUnavailable)) {
    return fail<Response>(Status::kBadRequest, detail::concat("status: unknown ", int{status}));
  }
  d.value.status = static_cast<Status>(status);
  std::string error;
  auto st = in.str(&d.value.message, kMaxMessageBytes, "message", &error);
  if (st != Status::kOk) return fail<Response>(st, std::move(error));
  st = in.str(&d.value.value, std::max<std::size_t>(max_value_bytes, 8), "value", &error);
  if (st != Status::kOk) return fail<Response>(st, std::move(error));
  if (in.left() != 0) {
    return fail<Response>(Status::kBadRequest,
                          detail::concat("frame: ", in.left(), " trailing bytes after value"));
  }
  return d;
}

std::string encode_i64(std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((u >> (8 * i)) & 0xffu);
  return out;
}

bool decode_i64(std::string_view bytes, std::int64_t* out) {
  if (bytes.size() != 8) return false;
  std::uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | static_cast<std::uint8_t>(bytes[i]);
  *out = static_cast<std::int64_t>(u);  // two's complement by definition since C++20
  return true;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  const std::size_t n = std::max(a.size(), b.size());
  // volatile keeps the compiler from turning the loop into an early-exit comparison.
  volatile unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    const unsigned y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

}  // namespace weightcast::comm::store_protocol
