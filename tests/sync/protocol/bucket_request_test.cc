// The bucket request's two readers side by side: the SAX pass takes exactly the bodies the DOM
// reader takes whole, with the same result, and hands every other body to it. Checked on
// hand-written bodies and on thousands of mutations of valid ones.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/protocol/bucket_request.h"
#include "sync/protocol/protocol.h"
#include "tests/sync/protocol/sample_bucket.h"

namespace weightcast::sync {
namespace {

// The shared sample, with a session and the digests our format sends.
UpdateWeightsFromDistributedRequest sample() {
  UpdateWeightsFromDistributedRequest r = sample_bucket();
  r.session_id = "s-1";
  r.digests = {std::string(32, 'a'), std::string(32, '0'), std::string(32, 'F'),
               "0123456789abcdefABCDEF0123456789"};
  return r;
}

// What the DOM reader makes of `body`: the request, or nullopt where it refuses it.
std::optional<UpdateWeightsFromDistributedRequest> dom(const std::string& body,
                                                       const ProtocolLimits& limits) {
  try {
    return read_bucket_request_dom(body, limits);
  } catch (const comm::BadRequestError&) {
    return std::nullopt;
  }
}

// The property: whatever the SAX pass takes, the DOM reader takes too, with an equal request.
void expect_agree(const std::string& body, const ProtocolLimits& limits = {}) {
  std::optional<UpdateWeightsFromDistributedRequest> fast;
  ASSERT_NO_THROW(fast = read_bucket_request_fast(body, limits)) << body;
  if (!fast) return;
  const auto slow = dom(body, limits);
  ASSERT_TRUE(slow.has_value()) << "the SAX pass took a body the DOM reader refuses: " << body;
  EXPECT_EQ(*fast, *slow) << body;
}

TEST(BucketRequestReaders, ValidBodiesTakeTheFastPathWithTheSameResult) {
  std::vector<UpdateWeightsFromDistributedRequest> valid{sample()};
  UpdateWeightsFromDistributedRequest r = sample();
  r.digests.clear();
  r.selector.reset();
  r.sequence.reset();
  r.load_format = LoadFormat::kPerTensor;
  valid.push_back(r);
  r = sample();
  r.delta = BucketDelta{DeltaCodec::kXorLz4, 99, "v6", std::vector(4, std::string(32, 'c'))};
  valid.push_back(r);
  for (const auto& request : valid) {
    const std::string body = to_json_string(request);
    const auto fast = read_bucket_request_fast(body, {});
    ASSERT_TRUE(fast.has_value()) << body;
    EXPECT_EQ(*fast, request);
    EXPECT_EQ(read_bucket_request_dom(body, {}), request);
    EXPECT_EQ(parse_update_weights_from_distributed(body), request);
  }
  // Spacing, key order, unknown fields (SGLang's rid) and nested values of other fields.
  const std::string spaced =
      "{ \"rid\": {\"a\": [1, {\"b\": null}], \"c\": 1.5},\n \"shapes\" : [ [2, 3] ],"
      " \"dtypes\": [\"torch.float16\"], \"names\": [\"w\"], \"selector\": \"draft\" }";
  const auto fast = read_bucket_request_fast(spaced, {});
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(fast->tensors, (std::vector<TensorMeta>{{"w", DType::kFloat16, {2, 3}}}));
  expect_agree(spaced);
}

TEST(BucketRequestReaders, BodiesWithAnyFaultGoToTheDomReader) {
  const std::string ok = to_json_string(sample());
  const std::vector<std::string> refused{
      "",
      "[]",
      "{}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]],\"names\":[\"w\"]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]],\"sequence\":1,"
      "\"sequence\":2}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]],\"rid\":{\"k\":1,\"k\":2}}",
      "{\"names\":[1],\"dtypes\":[\"float32\"],\"shapes\":[[1]]}",
      "{\"names\":null,\"dtypes\":[\"float32\"],\"shapes\":[[1]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1.0]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[18446744073709551615]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[-1]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[[1]]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]],\"digests\":[\"xyz\"]}",
      "{\"names\":[\"w w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]]}",
      "{\"names\":[\"w\",\"w\"],\"dtypes\":[\"float32\",\"float32\"],\"shapes\":[[1],[1]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float99\"],\"shapes\":[[1]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]]} trailing",
      "{\"names\":[\"w\xff\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]]}",
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]],\"selector\":\"none\"}",
      ok.substr(0, ok.size() - 1),
  };
  for (const auto& body : refused) {
    EXPECT_FALSE(read_bucket_request_fast(body, {}).has_value()) << body;
    EXPECT_THROW(parse_update_weights_from_distributed(body), comm::BadRequestError) << body;
  }
  // A list field given as null: the SAX pass hands it over too, and the DOM reader reads
  // SGLang's Optional "digests" as absent.
  const std::string null_digests =
      "{\"names\":[\"w\"],\"dtypes\":[\"float32\"],\"shapes\":[[1]],\"digests\":null}";
  EXPECT_FALSE(read_bucket_request_fast(null_digests, {}).has_value());
  EXPECT_TRUE(parse_update_weights_from_distributed(null_digests).digests.empty());
  // Limits: the SAX pass stops where the DOM reader's checks would refuse.
  ProtocolLimits tight;
  tight.max_names_per_bucket = 3;
  EXPECT_FALSE(read_bucket_request_fast(ok, tight).has_value());
  EXPECT_THROW(parse_update_weights_from_distributed(ok, tight), comm::BadRequestError);
  tight = {};
  tight.max_json_depth = 2;
  EXPECT_FALSE(read_bucket_request_fast(ok, tight).has_value());
  EXPECT_THROW(parse_update_weights_from_distributed(ok, tight), comm::BadRequestError);
  tight = {};
  tight.max_body_bytes = ok.size() - 1;
  EXPECT_FALSE(read_bucket_request_fast(ok, tight).has_value());
}

// Thousands of one- and two-byte mutations of valid bodies: replaced, inserted or deleted bytes,
// drawn from the characters that change JSON's meaning. The SAX pass never takes a body the DOM
// reader refuses, and never reads one differently.
TEST(BucketRequestReaders, MutatedBodiesNeverSplitTheReaders) {
  UpdateWeightsFromDistributedRequest delta = sample();
  delta.delta = BucketDelta{DeltaCodec::kXorZstd, 7, "v1", std::vector(4, std::string(32, 'e'))};
  const std::vector<std::string> bases{to_json_string(sample()), to_json_string(delta)};
  const std::string alphabet = "{}[]\",:0123456789-.eE \\atfnu\x01\xff";
  std::mt19937 rng(20261203);
  int taken = 0;
  for (int round = 0; round < 4000; ++round) {
    std::string body = bases[static_cast<std::size_t>(round) % bases.size()];
    const int edits = 1 + round % 2;
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % body.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          body[at] = c;
          break;
        case 1:
          body.insert(body.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          body.erase(at, 1);
          break;
      }
    }
    expect_agree(body);
    taken += read_bucket_request_fast(body, {}).has_value() ? 1 : 0;
  }
  // Some mutations stay valid (a digit of a dimension, a letter of a name): the fast path was
  // exercised, not only its refusals.
  EXPECT_GT(taken, 100);
}

}  // namespace
}  // namespace weightcast::sync
