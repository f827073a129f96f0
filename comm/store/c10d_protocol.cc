#include "comm/store/c10d_protocol.h"

#include <array>
#include <bit>
#include <cstring>

#include "comm/errors.h"

namespace weightcast::comm::c10d_protocol {

// torch sends integers in host order; every host it runs on is little-endian, and so is ours.
static_assert(std::endian::native == std::endian::little);

namespace {

constexpr std::size_t kQueryCount = static_cast<std::size_t>(Query::kPing) + 1;
constexpr int kNone = -1;

// Byte of each Query (in enum order) per generation; kNone where the generation lacks it.
// torch 1.x: TCPStore.cpp QueryType of the 1.1x line (confirmed on 1.13 by recording its bytes).
constexpr std::array<int, kQueryCount> kTorch1Bytes = {
    kNone, 0, 1, 2, 3, 4, 5, 6, 7, 8, kNone, kNone, kNone, kNone, kNone};
// torch 2.x: TCPStoreBackend.hpp QueryType (VALIDATE first, PING last).
constexpr std::array<int, kQueryCount> kTorch2Bytes = {0,     1, 2, 3,  4,  5,  6, 7,
                                                       kNone, 8, 9, 10, 11, 12, 13};

const std::array<int, kQueryCount>& table(Generation g) {
  return g == Generation::kTorch1 ? kTorch1Bytes : kTorch2Bytes;
}

template <typename T>
void append_raw(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // the wire is host order, and every host here is LE
  out->append(buf, sizeof(T));
}

template <typename T>
T read_raw(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A cursor over a possibly incomplete request. Any shortfall sets need_more, any limit breach
// sets bad; after either, every further read fails, so decoders can chain reads and check once.
class Reader {
 public:
  Reader(std::string_view buf, const Limits& limits) : buf_(buf), limits_(limits) {}

  bool ok() const { return !need_more_ && error_.empty(); }
  bool need_more() const { return need_more_ && error_.empty(); }
  const std::string& error() const { return error_; }
  std::size_t pos() const { return pos_; }

  template <typename T>
  bool value(T* out) {
    if (!have(sizeof(T))) return false;
    *out = read_raw<T>(buf_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }

  // u64 length + bytes, at most `limit` bytes; `what` names the field in errors.
  bool bytes(std::size_t limit, const char* what, std::string* out) {
    std::uint64_t n = 0;
    if (!value(&n)) return false;
    if (n > limit)
      return fail(detail::concat(what, " of ", n, " bytes exceeds the limit of ", limit));
    if (!have(static_cast<std::size_t>(n))) return false;
    out->assign(buf_.data() + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return true;
  }
  bool key(std::string* out) { return bytes(limits_.max_key_bytes, "key", out); }
  bool val(std::string* out) { return bytes(limits_.max_value_bytes, "value", out); }

  // A u64 count of list entries, checked against max_keys_per_request.
  bool count(std::uint64_t* n) { return value(n) && count_fits(*n); }
  bool count_fits(std::uint64_t n) {
    if (n <= limits_.max_keys_per_request) return true;
    return fail(
        detail::concat("key count ", n, " exceeds the limit of ", limits_.max_keys_per_request));
  }

  bool fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }

 private:
  // True when n more bytes are buffered. The request-size limit is checked on the claim, so a
  // request that can never fit is refused before the server waits for (or buffers) its bytes.
  bool have(std::size_t n) {
    if (!ok()) return false;
    if (n > limits_.max_request_bytes || pos_ > limits_.max_request_bytes - n) {
      return fail(
          detail::concat("request larger than the limit of ", limits_.max_request_bytes, " bytes"));
    }
    if (buf_.size() - pos_ < n) {
      need_more_ = true;
      return false;
    }
    return true;
  }

  std::string_view buf_;
  const Limits& limits_;
  std::size_t pos_ = 0;
  bool need_more_ = false;
  std::string error_;
};

bool read_keys(Reader& r, std::vector<std::string>* keys) {
  std::uint64_t n = 0;
  if (!r.count(&n)) return false;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (!r.key(&keys->emplace_back())) return false;
  }
  return true;
}

// MULTI_SET: an i64 count, then (key, value) pairs.
bool read_pairs(Reader& r, Request* req) {
  std::int64_t n = 0;
  if (!r.value(&n)) return false;
  if (n < 0) return r.fail(detail::concat("MULTI_SET count ", n, " is negative"));
  if (!r.count_fits(static_cast<std::uint64_t>(n))) return false;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!r.key(&req->keys.emplace_back()) || !r.val(&req->values.emplace_back())) return false;
  }
  return true;
}

// Reads the arguments of `req->query`; false on need-more or bad (see r).
bool decode_body(Reader& r, Request* req) {
  switch (req->query) {
    case Query::kValidate:
    case Query::kPing:
      return r.value(&req->word);
    case Query::kSet:
    case Query::kAppend:
      return r.key(&req->keys.emplace_back()) && r.val(&req->values.emplace_back());
    case Query::kCompareSet:
      return r.key(&req->keys.emplace_back()) && r.val(&req->values.emplace_back()) &&
             r.val(&req->values.emplace_back());
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kWatchKey:
      return r.key(&req->keys.emplace_back());
    case Query::kAdd:
      return r.key(&req->keys.emplace_back()) && r.value(&req->delta);
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      return read_keys(r, &req->keys);
    case Query::kMultiSet:
      return read_pairs(r, req);
    case Query::kGetNumKeys:
    case Query::kCancelWait:
      return true;
  }
  return r.fail("unknown query");
}

// Which fields each query carries, for encode_request's misuse checks.
void check_shape(const Request& req) {
  const std::size_t k = req.keys.size();
  const std::size_t v = req.values.size();
  switch (req.query) {
    case Query::kSet:
    case Query::kAppend:
      WC_ENFORCE(k == 1 && v == 1, query_name(req.query), " takes one key and one value");
      return;
    case Query::kCompareSet:
      WC_ENFORCE(k == 1 && v == 2, "COMPARE_SET takes one key and two values");
      return;
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kWatchKey:
    case Query::kAdd:
      WC_ENFORCE(k == 1 && v == 0, query_name(req.query), " takes one key");
      return;
    case Query::kMultiSet:
      WC_ENFORCE_EQ(k, v, "MULTI_SET takes as many values as keys");
      return;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      WC_ENFORCE_EQ(v, std::size_t{0}, query_name(req.query), " takes no values");
      return;
    case Query::kValidate:
    case Query::kPing:
    case Query::kGetNumKeys:
    case Query::kCancelWait:
      WC_ENFORCE(k == 0 && v == 0, query_name(req.query), " takes no keys or values");
      return;
  }
}

}  // namespace

const char* query_name(Query q) {
  static constexpr std::array<const char*, kQueryCount> kNames = {
      "VALIDATE", "SET",       "COMPARE_SET", "GET",         "ADD",
      "CHECK",    "WAIT",      "GETNUMKEYS",  "WATCH_KEY",   "DELETE_KEY",
      "APPEND",   "MULTI_GET", "MULTI_SET",   "CANCEL_WAIT", "PING"};
  const auto i = static_cast<std::size_t>(q);
  return i < kQueryCount ? kNames[i] : "UNKNOWN";
}

const char* generation_name(Generation g) {
  return g == Generation::kTorch1 ? "torch 1.x" : "torch 2.x";
}

std::optional<std::uint8_t> query_byte(Generation g, Query q) {
  const auto i = static_cast<std::size_t>(q);
  if (i >= kQueryCount || table(g)[i] == kNone) return std::nullopt;
  return static_cast<std::uint8_t>(table(g)[i]);
}

std::optional<Query> query_from_byte(Generation g, std::uint8_t byte) {
  for (std::size_t i = 0; i < kQueryCount; ++i) {
    if (table(g)[i] == byte) return static_cast<Query>(i);
  }
  return std::nullopt;
}

std::string encode_request(Generation g, const Request& req) {
  const auto byte = query_byte(g, req.query);
  WC_ENFORCE(byte.has_value(), query_name(req.query), " does not exist in ", generation_name(g));
  check_shape(req);
  std::string out;
  append_u8(&out, *byte);
  switch (req.query) {
    case Query::kValidate:
    case Query::kPing:
      append_u32(&out, req.word);
      return out;
    case Query::kAdd:
      append_bytes(&out, req.keys[0]);
      append_i64(&out, req.delta);
      return out;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      append_u64(&out, req.keys.size());
      for (const auto& k : req.keys) append_bytes(&out, k);
      return out;
    case Query::kMultiSet:
      append_i64(&out, static_cast<std::int64_t>(req.keys.size()));
      for (std::size_t i = 0; i < req.keys.size(); ++i) {
        append_bytes(&out, req.keys[i]);
        append_bytes(&out, req.values[i]);
      }
      return out;
    default:  // one key, then any values, in order
      for (const auto& k : req.keys) append_bytes(&out, k);
      for (const auto& v : req.values) append_bytes(&out, v);
      return out;
  }
}

DecodeResult decode_request(Generation g, std::string_view buffer, const Limits& limits) {
  DecodeResult res;
  if (buffer.empty()) return res;  // kNeedMore
  const auto query = query_from_byte(g, static_cast<std::uint8_t>(buffer[0]));
  if (!query) {
    res.status = Decode::kBad;
    res.error = detail::concat("unknown ", generation_name(g), " query byte ",
                               static_cast<int>(static_cast<std::uint8_t>(buffer[0])));
    return res;
  }
  Reader r(buffer.substr(1), limits);
  res.request.query = *query;
  if (decode_body(r, &res.request)) {
    res.status = Decode::kDone;
    res.consumed = 1 + r.pos();
    return res;
  }
  res.request = Request{};
  if (r.need_more()) return res;
  res.status = Decode::kBad;
  res.error = detail::concat(query_name(*query), ": ", r.error());
  return res;
}

std::optional<Generation> detect_generation(std::string_view first_bytes) {
  if (first_bytes.empty()) return std::nullopt;
  if (first_bytes[0] != 0) return Generation::kTorch1;
  if (first_bytes.size() < 5) return std::nullopt;
  return read_u32(first_bytes.data() + 1) == kValidateMagic ? Generation::kTorch2
                                                            : Generation::kTorch1;
}

void append_u8(std::string* out, std::uint8_t v) {
  out->push_back(static_cast<char>(v));
}
void append_u32(std::string* out, std::uint32_t v) {
  append_raw(out, v);
}
void append_i64(std::string* out, std::int64_t v) {
  append_raw(out, v);
}
void append_u64(std::string* out, std::uint64_t v) {
  append_raw(out, v);
}
void append_bytes(std::string* out, std::string_view v) {
  append_u64(out, v.size());
  out->append(v);
}

std::uint32_t read_u32(const char* p) {
  return read_raw<std::uint32_t>(p);
}
std::uint64_t read_u64(const char* p) {
  return read_raw<std::uint64_t>(p);
}
std::int64_t read_i64(const char* p) {
  return read_raw<std::int64_t>(p);
}

}  // namespace weightcast::comm::c10d_protocol
