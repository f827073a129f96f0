// The store wire protocol as pure functions: exact bytes, round trips, limits checked before
// allocation, per-op shapes, and a deterministic mutation sweep over the decoders.
#include <gtest/gtest.h>

#include <random>

#include "comm/store.h"
#include "comm/store/store_protocol.h"

namespace weightcast::comm::store_protocol {
namespace {

constexpr std::size_t kMaxValue = 4096;
const Limits kLimits{kMaxValue, 16};

std::string body_of(const std::string& frame) {
  return frame.substr(kFrameHeaderBytes);
}

Request make(Op op, std::vector<std::string> keys, std::string value = {}, std::uint32_t t = 0) {
  Request r;
  r.op = op;
  r.timeout_ms = t;
  r.keys = std::move(keys);
  r.value = std::move(value);
  return r;
}

std::vector<Request> samples() {
  return {make(Op::kHello, {std::string(kProtocolName)}, "token\0x"),
          make(Op::kSet, {"key"}, std::string("v\0\xff", 3), 1000),
          make(Op::kSet, {"empty-value"}, ""),
          make(Op::kGet, {std::string("bin\0key", 7)}, {}, 0xfffffffe),
          make(Op::kWait, {"a", "b", "c"}, {}, 50),
          make(Op::kAdd, {"n"}, encode_i64(-3)),
          make(Op::kCheck, {std::string(Store::kMaxKeyBytes, 'k')})};
}

TEST(StoreProtocolTest, FrameBytesAreTheDocumentedLittleEndianLayout) {
  const std::string f = encode_request(make(Op::kCheck, {"k"}, {}, 0x01020304));
  const std::string expected(
      "\x12\x00\x00\x00"   // body length 18
      "\x06"               // CHECK
      "\x04\x03\x02\x01"   // timeout_ms
      "\x01\x00\x00\x00"   // one key
      "\x01\x00\x00\x00k"  // "k"
      "\x00\x00\x00\x00",  // empty value
      22);
  EXPECT_EQ(f, expected);
  EXPECT_EQ(decode_frame_length(f), 18u);
  Response r{Status::kTimeout, "m", "v"};
  EXPECT_EQ(encode_response(r), std::string("\x0b\x00\x00\x00\x01\x01\x00\x00\x00m"
                                            "\x01\x00\x00\x00v",
                                            15));
}

TEST(StoreProtocolTest, RequestsAndResponsesRoundTrip) {
  for (const auto& r : samples()) {
    const auto f = encode_request(r);
    EXPECT_EQ(decode_frame_length(f), f.size() - kFrameHeaderBytes);
    auto d = decode_request_body(body_of(f), kLimits);
    ASSERT_TRUE(d.ok()) << op_name(r.op) << ": " << d.error;
    EXPECT_EQ(d.value.op, r.op);
    EXPECT_EQ(d.value.timeout_ms, r.timeout_ms);
    EXPECT_EQ(d.value.keys, r.keys);
    EXPECT_EQ(d.value.value, r.value);
  }
  Response resp{Status::kRejected, "why", std::string("\0\1", 2)};
  auto d = decode_response_body(body_of(encode_response(resp)), kMaxValue);
  ASSERT_TRUE(d.ok()) << d.error;
  EXPECT_EQ(d.value.status, Status::kRejected);
  EXPECT_EQ(d.value.message, "why");
  EXPECT_EQ(d.value.value, std::string("\0\1", 2));
}

TEST(StoreProtocolTest, EveryTruncationIsABadRequest) {
  for (const auto& r : samples()) {
    const auto body = body_of(encode_request(r));
    for (std::size_t n = 0; n < body.size(); ++n) {
      auto d = decode_request_body(std::string_view(body).substr(0, n), kLimits);
      EXPECT_EQ(d.status, Status::kBadRequest) << op_name(r.op) << " cut at " << n;
    }
    EXPECT_EQ(decode_request_body(body + "x", kLimits).status, Status::kBadRequest);
  }
  const auto resp = body_of(encode_response({Status::kOk, "msg", "value"}));
  for (std::size_t n = 0; n < resp.size(); ++n) {
    EXPECT_FALSE(decode_response_body(std::string_view(resp).substr(0, n), kMaxValue).ok()) << n;
  }
}

TEST(StoreProtocolTest, LengthsOverTheirLimitsAreTooLarge) {
  auto status = [](const Request& r) {
    return decode_request_body(body_of(encode_request(r)), kLimits).status;
  };
  EXPECT_EQ(status(make(Op::kSet, {"k"}, std::string(kMaxValue, 'v'))), Status::kOk);
  EXPECT_EQ(status(make(Op::kSet, {"k"}, std::string(kMaxValue + 1, 'v'))), Status::kTooLarge);
  EXPECT_EQ(status(make(Op::kGet, {std::string(Store::kMaxKeyBytes + 1, 'k')})), Status::kTooLarge);
  EXPECT_EQ(status(make(Op::kWait, std::vector<std::string>(16, "k"))), Status::kOk);
  EXPECT_EQ(status(make(Op::kWait, std::vector<std::string>(17, "k"))), Status::kTooLarge);

  const auto max = max_request_body_bytes(kLimits);
  EXPECT_TRUE(check_request_frame_length(max, kLimits).ok());
  EXPECT_EQ(check_request_frame_length(max + 1, kLimits).status, Status::kTooLarge);
  EXPECT_EQ(check_request_frame_length(1u << 30, kLimits).status, Status::kTooLarge);
  EXPECT_EQ(check_response_frame_length(1u << 30, kMaxValue).status, Status::kTooLarge);
  EXPECT_TRUE(check_response_frame_length(max_response_body_bytes(kMaxValue), kMaxValue).ok());

  // A value length claiming 1 GiB in a tiny body: refused as too large, not read or sized.
  std::string body = body_of(encode_request(make(Op::kSet, {"k"}, "")));
  body.replace(body.size() - 4, 4, std::string("\x00\x00\x00\x40", 4));
  EXPECT_EQ(decode_request_body(body, kLimits).status, Status::kTooLarge);
  // A key count the body cannot hold, within the limit: truncated, before sizing the key list.
  std::string keys = body_of(encode_request(make(Op::kWait, {"a"})));
  keys[5] = '\x0f';
  EXPECT_EQ(decode_request_body(keys, kLimits).status, Status::kBadRequest);
}

TEST(StoreProtocolTest, PerOpShapesAreEnforced) {
  auto status = [](const Request& r) {
    return decode_request_body(body_of(encode_request(r)), kLimits).status;
  };
  EXPECT_EQ(status(make(Op::kSet, {"a", "b"}, "v")), Status::kBadRequest);
  EXPECT_EQ(status(make(Op::kGet, {}, {})), Status::kBadRequest);
  EXPECT_EQ(status(make(Op::kGet, {"k"}, "v")), Status::kBadRequest);
  EXPECT_EQ(status(make(Op::kWait, {}, {})), Status::kBadRequest);
  EXPECT_EQ(status(make(Op::kAdd, {"k"}, "1234567")), Status::kBadRequest);
  EXPECT_EQ(status(make(Op::kCheck, {"a", "b"})), Status::kBadRequest);
  EXPECT_EQ(status(make(Op::kHello, {})), Status::kBadRequest);
  EXPECT_EQ(status(make(Op::kSet, {""}, "v")), Status::kBadRequest);
  for (char op : {'\x00', '\x07', '\xff'}) {
    std::string body = body_of(encode_request(make(Op::kCheck, {"k"})));
    body[0] = op;
    EXPECT_EQ(decode_request_body(body, kLimits).status, Status::kBadRequest) << int(op);
  }
  std::string resp = body_of(encode_response({}));
  resp[0] = '\x08';
  EXPECT_EQ(decode_response_body(resp, kMaxValue).status, Status::kBadRequest);
}

TEST(StoreProtocolTest, LongMessagesAreCutToTheLimit) {
  auto d = decode_response_body(
      body_of(encode_response({Status::kTimeout, std::string(kMaxMessageBytes + 100, 'm'), {}})),
      kMaxValue);
  ASSERT_TRUE(d.ok()) << d.error;
  EXPECT_EQ(d.value.message.size(), kMaxMessageBytes);
}

TEST(StoreProtocolTest, I64RoundTripsAndRejectsWrongSizes) {
  for (std::int64_t v : {INT64_MIN, std::int64_t{-1}, std::int64_t{0}, std::int64_t{1},
                         std::int64_t{0x0102030405060708}, INT64_MAX}) {
    std::int64_t out = 42;
    ASSERT_TRUE(decode_i64(encode_i64(v), &out));
    EXPECT_EQ(out, v);
  }
  EXPECT_EQ(encode_i64(1), std::string("\x01\0\0\0\0\0\0\0", 8));
  std::int64_t out = 0;
  EXPECT_FALSE(decode_i64("1234567", &out));
  EXPECT_FALSE(decode_i64("123456789", &out));
}

TEST(StoreProtocolTest, ConstantTimeEqualIsEquality) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secret", "secreT"));
  EXPECT_FALSE(constant_time_equal("secret", std::string_view("secret\0", 7)));
  EXPECT_FALSE(constant_time_equal(std::string_view("secret\0", 7), "secret"));
  EXPECT_FALSE(constant_time_equal("secret", "sec"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_FALSE(constant_time_equal("x", ""));
}

TEST(StoreProtocolTest, KeepsConnectionOnlyForInSyncStatuses) {
  EXPECT_TRUE(keeps_connection(Status::kOk));
  EXPECT_TRUE(keeps_connection(Status::kTimeout));
  EXPECT_TRUE(keeps_connection(Status::kRejected));
  for (Status s : {Status::kBadRequest, Status::kUnauthorized, Status::kTooLarge,
                   Status::kForbidden, Status::kUnavailable}) {
    EXPECT_FALSE(keeps_connection(s)) << status_name(s);
  }
}

// Mutations of valid bodies never crash the decoders, and whatever decodes re-encodes to the
// same bytes (the encoding is canonical, so a decoder cannot be lenient in two ways at once).
TEST(StoreProtocolTest, MutatedBodiesDecodeSafelyAndCanonically) {
  std::mt19937 rng(1234);
  int decoded = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const auto all = samples();
    std::string body = body_of(encode_request(all[rng() % all.size()]));
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const std::size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0:
          body[at] = static_cast<char>(rng());
          break;
        case 1:
          body.erase(at, 1);
          break;
        default:
          body.insert(at, 1, static_cast<char>(rng()));
          break;
      }
    }
    auto d = decode_request_body(body, kLimits);
    if (d.ok()) {
      ++decoded;
      EXPECT_EQ(body_of(encode_request(d.value)), body);
    } else {
      EXPECT_FALSE(d.error.empty());
    }
    (void)decode_response_body(body, kMaxValue);
  }
  EXPECT_GT(decoded, 0);
}

}  // namespace
}  // namespace weightcast::comm::store_protocol
