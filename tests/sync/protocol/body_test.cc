// Body-level checks every parse_* function applies before reading fields: size, UTF-8, nesting
// depth, JSON syntax, duplicate keys and the top-level type.
#include <gtest/gtest.h>

#include <string>

#include "comm/errors.h"
#include "sync/protocol/protocol.h"
#include "tests/sync/protocol/bad_request.h"

namespace weightcast::sync {
namespace {

std::string nested(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(ProtocolBody, DeepNestingRejectedBeforeParsing) {
  ProtocolLimits limits;
  limits.max_json_depth = 16;
  // Depth 16 in total (the object counts as one) is accepted, 17 is not.
  const std::string ok = R"({"selector":"all","x":)" + nested(15) + "}";
  EXPECT_EQ(parse_begin_weight_update(ok, limits).selector, Selector::kAll);
  const std::string deep = R"({"selector":"all","x":)" + nested(16) + "}";
  const std::string what = bad_request([&] { parse_begin_weight_update(deep, limits); });
  EXPECT_NE(what.find("nested deeper than the limit of 16"), std::string::npos) << what;
  // A pathological body far past any parser's recursion comfort is refused the same way.
  EXPECT_THROW(parse_begin_weight_update(nested(1'000'000), {}), comm::BadRequestError);
  EXPECT_THROW(parse_begin_weight_update(std::string(1'000'000, '{'), {}), comm::BadRequestError);
}

TEST(ProtocolBody, BracketsInsideStringsDoNotCountAsNesting) {
  ProtocolLimits limits;
  limits.max_json_depth = 2;
  const std::string body = R"({"selector":"target","note":"[[[[{{{{ \" [[[["})";
  EXPECT_EQ(parse_begin_weight_update(body, limits).selector, Selector::kTarget);
}

TEST(ProtocolBody, InvalidUtf8Rejected) {
  const std::string body = "{\"selector\":\"all\",\"x\":\"\xff\xfe\"}";
  const std::string what = bad_request([&] { parse_begin_weight_update(body); });
  EXPECT_NE(what.find("not valid UTF-8"), std::string::npos) << what;
  EXPECT_NE(what.find("offset 23"), std::string::npos) << what;
  // Overlong encodings and surrogates, which a lax decoder would accept.
  EXPECT_THROW(parse_begin_weight_update("{\"selector\":\"\xc0\xe1\"}"), comm::BadRequestError);
  EXPECT_THROW(parse_begin_weight_update("{\"selector\":\"\xed\xa0\x80\"}"), comm::BadRequestError);
  // Well-formed non-ASCII text in an ignored field is fine.
  EXPECT_NO_THROW(parse_begin_weight_update("{\"selector\":\"all\",\"x\":\"\xe2\x82\xac\"}"));
}

TEST(ProtocolBody, OversizeRejectedFirst) {
  ProtocolLimits limits;
  limits.max_body_bytes = 64;
  const std::string body = R"({"selector":"draft","pad":")" + std::string(100, 'x') + "\"}";
  const std::string what = bad_request([&] { parse_begin_weight_update(body, limits); });
  EXPECT_NE(what.find("larger than the limit of 64"), std::string::npos) << what;
  limits.max_body_bytes = body.size();
  EXPECT_EQ(parse_begin_weight_update(body, limits).selector, Selector::kDraft);
}

TEST(ProtocolBody, SyntaxAndTypeErrors) {
  const struct {
    std::string body;
    const char* expected;
  } cases[] = {
      {"", "empty"},
      {"   \n", "empty"},
      {"{", "invalid JSON"},
      {"{\"selector\":\"all\",}", "invalid JSON"},
      {"{\"selector\":'all'}", "invalid JSON"},
      {"{\"selector\":\"all\"} trailing", "invalid JSON"},
      {"{\"selector\":\"all\"/*c*/}", "invalid JSON"},
      {"[]", "must be a JSON object (got array)"},
      {"\"all\"", "must be a JSON object (got string)"},
      {"null", "must be a JSON object (got null)"},
      {"42", "must be a JSON object (got integer)"},
      {"{\"selector\":\"all\",\"selector\":\"target\"}", "duplicate key 'selector'"},
      {"{\"a\":{\"k\":1,\"k\":2},\"selector\":\"all\"}", "duplicate key 'k'"},
      {"{\"selector\":\"a\x01\"}", "invalid JSON"},
  };
  for (const auto& c : cases) {
    const std::string what = bad_request([&] { parse_begin_weight_update(c.body); });
    EXPECT_EQ(what.rfind("body: ", 0), 0u) << what;
    EXPECT_NE(what.find(c.expected), std::string::npos) << c.body << " -> " << what;
  }
}

TEST(ProtocolBody, SameKeyInDifferentObjectsIsNotADuplicate) {
  EXPECT_NO_THROW(
      parse_begin_weight_update(R"({"selector":"all","a":{"selector":1},"b":[{"selector":2}]})"));
}

TEST(ProtocolBody, EmptyBodyAcceptedOnlyWhereNoFieldIsRequired) {
  EXPECT_NO_THROW(parse_flush_cache(""));
  EXPECT_NO_THROW(parse_end_weight_update(" "));
  EXPECT_EQ(parse_continue_generation("").torch_empty_cache, true);
  EXPECT_EQ(parse_pause_generation("").mode, PauseMode::kAbort);
  EXPECT_EQ(parse_destroy_weights_update_group("").group_name, kDefaultGroupName);
  EXPECT_THROW(parse_flush_cache("[]"), comm::BadRequestError);
  EXPECT_THROW(parse_end_weight_update("{"), comm::BadRequestError);
  EXPECT_THROW(parse_begin_weight_update(""), comm::BadRequestError);
  EXPECT_THROW(parse_update_weight_version(""), comm::BadRequestError);
}

}  // namespace
}  // namespace weightcast::sync
