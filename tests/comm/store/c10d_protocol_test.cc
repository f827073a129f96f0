// Byte-level tests of torch's c10d TCPStore protocol (comm/store/c10d_protocol.h): the exact bytes
// of every query in both generations (the 1.x ones as recorded from Debian's torch 1.13, see
// docs/interop_store_notes.md), round trips, generation detection, and the decoder's refusals:
// limits checked on the claim, truncated input asking for more, unknown bytes refused.
#include <gtest/gtest.h>

#include <string>

#include "comm/errors.h"
#include "comm/store/c10d_protocol.h"

namespace weightcast::comm::c10d_protocol {
namespace {

using namespace std::string_literals;

std::string u64(std::uint64_t v) {
  std::string s;
  append_u64(&s, v);
  return s;
}
std::string str(const std::string& v) {
  return u64(v.size()) + v;
}

Request req(Query q, std::vector<std::string> keys = {}, std::vector<std::string> values = {}) {
  Request r;
  r.query = q;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

// What torch 1.13's client sent for each call (tests/interop and docs/interop_store_notes.md).
TEST(C10dProtocolTest, Torch1BytesMatchTheRecordedTorch113Client) {
  const auto g = Generation::kTorch1;
  Request add = req(Query::kAdd, {"init/"});
  add.delta = 1;
  EXPECT_EQ(encode_request(g, add), "\x03"s + str("init/") + "\x01\0\0\0\0\0\0\0"s);
  EXPECT_EQ(encode_request(g, req(Query::kSet, {"/k"}, {"v"})), "\x00"s + str("/k") + str("v"));
  EXPECT_EQ(encode_request(g, req(Query::kWait, {"/k"})), "\x05"s + u64(1) + str("/k"));
  EXPECT_EQ(encode_request(g, req(Query::kGet, {"/k"})), "\x02"s + str("/k"));
  EXPECT_EQ(encode_request(g, req(Query::kCompareSet, {"/k"}, {"v", "w"})),
            "\x01"s + str("/k") + str("v") + str("w"));
  EXPECT_EQ(encode_request(g, req(Query::kGetNumKeys)), "\x06"s);
  EXPECT_EQ(encode_request(g, req(Query::kDeleteKey, {"/k"})), "\x08"s + str("/k"));
  EXPECT_EQ(encode_request(g, req(Query::kCheck, {"/a", "/b"})),
            "\x04"s + u64(2) + str("/a") + str("/b"));
}

TEST(C10dProtocolTest, Torch2BytesFollowTheShiftedNumbering) {
  const auto g = Generation::kTorch2;
  Request validate = req(Query::kValidate);
  validate.word = kValidateMagic;
  EXPECT_EQ(encode_request(g, validate), "\x00\xCE\xF7\x85\x3C"s);
  Request ping = req(Query::kPing);
  ping.word = 0x01020304;
  EXPECT_EQ(encode_request(g, ping), "\x0D\x04\x03\x02\x01"s);
  EXPECT_EQ(encode_request(g, req(Query::kSet, {"/k"}, {"v"})), "\x01"s + str("/k") + str("v"));
  EXPECT_EQ(encode_request(g, req(Query::kCompareSet, {"/k"}, {"", "d"})),
            "\x02"s + str("/k") + str("") + str("d"));
  EXPECT_EQ(encode_request(g, req(Query::kGet, {"/k"})), "\x03"s + str("/k"));
  Request add = req(Query::kAdd, {"/c"});
  add.delta = -2;
  EXPECT_EQ(encode_request(g, add), "\x04"s + str("/c") + "\xFE\xFF\xFF\xFF\xFF\xFF\xFF\xFF"s);
  EXPECT_EQ(encode_request(g, req(Query::kCheck, {"/k"})), "\x05"s + u64(1) + str("/k"));
  EXPECT_EQ(encode_request(g, req(Query::kWait, {"/k"})), "\x06"s + u64(1) + str("/k"));
  EXPECT_EQ(encode_request(g, req(Query::kGetNumKeys)), "\x07"s);
  EXPECT_EQ(encode_request(g, req(Query::kDeleteKey, {"/k"})), "\x08"s + str("/k"));
  EXPECT_EQ(encode_request(g, req(Query::kAppend, {"/k"}, {"x"})), "\x09"s + str("/k") + str("x"));
  EXPECT_EQ(encode_request(g, req(Query::kMultiGet, {"/a", "/b"})),
            "\x0A"s + u64(2) + str("/a") + str("/b"));
  EXPECT_EQ(encode_request(g, req(Query::kMultiSet, {"/a", "/b"}, {"1", "2"})),
            "\x0B"s + u64(2) + str("/a") + str("1") + str("/b") + str("2"));
  EXPECT_EQ(encode_request(g, req(Query::kCancelWait)), "\x0C"s);
}

TEST(C10dProtocolTest, QueriesAGenerationLacksAreMisuse) {
  for (Query q : {Query::kValidate, Query::kPing, Query::kAppend, Query::kMultiGet,
                  Query::kMultiSet, Query::kCancelWait}) {
    EXPECT_FALSE(query_byte(Generation::kTorch1, q).has_value()) << query_name(q);
  }
  EXPECT_FALSE(query_byte(Generation::kTorch2, Query::kWatchKey).has_value());
  EXPECT_THROW(encode_request(Generation::kTorch1, req(Query::kCancelWait)), EnforceError);
  EXPECT_THROW(encode_request(Generation::kTorch2, req(Query::kGet)), EnforceError);  // no key
  EXPECT_FALSE(query_from_byte(Generation::kTorch1, 9).has_value());
  EXPECT_FALSE(query_from_byte(Generation::kTorch2, 14).has_value());
}

TEST(C10dProtocolTest, EveryQueryRoundTripsAndStreamsBackToBack) {
  for (Generation g : {Generation::kTorch1, Generation::kTorch2}) {
    std::vector<Request> all = {req(Query::kSet, {"/k"}, {std::string("\0v\xff", 3)}),
                                req(Query::kCompareSet, {"/k"}, {"a", "b"}),
                                req(Query::kGet, {"/k"}),
                                req(Query::kCheck, {"/a", "/b"}),
                                req(Query::kWait, {}),
                                req(Query::kGetNumKeys),
                                req(Query::kDeleteKey, {"/k"})};
    Request add = req(Query::kAdd, {"/c"});
    add.delta = INT64_MIN;
    all.push_back(add);
    if (g == Generation::kTorch2) {
      all.push_back(req(Query::kMultiSet, {"/a"}, {"1"}));
      all.push_back(req(Query::kMultiGet, {"/a"}));
      all.push_back(req(Query::kAppend, {"/a"}, {""}));
      all.push_back(req(Query::kCancelWait));
    }
    std::string stream;
    for (const auto& r : all) stream += encode_request(g, r);
    std::string_view rest = stream;
    for (const auto& want : all) {
      auto d = decode_request(g, rest, Limits{});
      ASSERT_EQ(d.status, Decode::kDone) << query_name(want.query) << ": " << d.error;
      EXPECT_EQ(d.request, want) << query_name(want.query);
      rest.remove_prefix(d.consumed);
    }
    EXPECT_TRUE(rest.empty());
  }
}

TEST(C10dProtocolTest, EveryTruncationAsksForMore) {
  const auto g = Generation::kTorch2;
  const std::string full = encode_request(g, req(Query::kCompareSet, {"/key"}, {"old", "new"}));
  for (std::size_t n = 0; n < full.size(); ++n) {
    auto d = decode_request(g, std::string_view(full).substr(0, n), Limits{});
    EXPECT_EQ(d.status, Decode::kNeedMore) << n;
  }
  EXPECT_EQ(decode_request(g, full, Limits{}).status, Decode::kDone);
}

TEST(C10dProtocolTest, ClaimsOverTheLimitsAreRefusedBeforeTheirBytesArrive) {
  Limits lim;
  lim.max_key_bytes = 16;
  lim.max_value_bytes = 64;
  lim.max_keys_per_request = 4;
  lim.max_request_bytes = 256;
  const auto g = Generation::kTorch1;
  auto bad = [&](const std::string& bytes, const char* field) {
    auto d = decode_request(g, bytes, lim);
    EXPECT_EQ(d.status, Decode::kBad) << field;
    EXPECT_NE(d.error.find(field), std::string::npos) << d.error;
  };
  bad("\x02"s + u64(17), "key");                        // GET, key claims 17 bytes
  bad("\x00"s + str("/k") + u64(65), "value");          // SET, value claims 65
  bad("\x00"s + str("/k") + u64(UINT64_MAX), "value");  // no overflow on absurd claims
  bad("\x05"s + u64(5), "key count");                   // WAIT of 5 keys
  bad("\x05"s + u64(UINT64_MAX), "key count");
  std::string many = "\x04"s + u64(4);
  for (int i = 0; i < 4; ++i) many += str(std::string(16, 'k'));
  EXPECT_EQ(decode_request(g, many, lim).status, Decode::kDone);
  // Within every per-field limit, but together over the request limit.
  Limits tight = lim;
  tight.max_request_bytes = 64;
  EXPECT_EQ(decode_request(g, many, tight).status, Decode::kBad);
  bad("\x09"s, "query byte");
  // MULTI_SET's count is signed: negative is refused.
  auto d = decode_request(Generation::kTorch2, "\x0B"s + u64(UINT64_MAX), lim);
  EXPECT_EQ(d.status, Decode::kBad);
  EXPECT_NE(d.error.find("negative"), std::string::npos) << d.error;
}

TEST(C10dProtocolTest, GenerationIsToldFromTheFirstBytes) {
  EXPECT_FALSE(detect_generation("").has_value());
  EXPECT_FALSE(detect_generation("\x00\xCE\xF7"s).has_value());
  EXPECT_EQ(detect_generation("\x00\xCE\xF7\x85\x3C"s), Generation::kTorch2);
  EXPECT_EQ(detect_generation("\x00\x02\0\0\0"s), Generation::kTorch1);  // SET "/k"...
  EXPECT_EQ(detect_generation("\x06"s), Generation::kTorch1);            // GETNUMKEYS probe
  EXPECT_EQ(detect_generation("\x03"s), Generation::kTorch1);            // ADD "init/"
}

}  // namespace
}  // namespace weightcast::comm::c10d_protocol
