// Response bodies: round trips, the SGLang-compatible common part, and malformed responses the
// trainer client must refuse.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/protocol/protocol.h"
#include "tests/sync/protocol/bad_request.h"

namespace weightcast::sync {
namespace {

using Json = nlohmann::json;

ServerInfoResponse sample_server_info() {
  ServerInfoResponse s;
  s.message = "ok";
  s.version = "0.1.0";
  s.runners = {
      {Runner::kTarget, {"model.*"}, "none", 291, 7},
      {Runner::kDraft, {"mtp.*", "model.embed_tokens.weight"}, "shuffle", 12, std::nullopt}};
  s.selectors = {Selector::kAll, Selector::kTarget, Selector::kDraft};
  s.backends = {Backend::kGloo, Backend::kNccl};
  s.rank_count = 2;
  s.tp_size = 2;
  s.weight_version = "default";
  s.speculative_algorithm = "EAGLE";
  s.session_selector = Selector::kTarget;
  s.shard_plans = {R"({"tensors":{"model.norm.weight":"replicated"}})",
                   R"({"tensors":{"model.norm.weight":"replicated"}})"};
  return s;
}

WeightsChecksumResponse sample_checksum() {
  WeightsChecksumResponse c;
  c.runner = Runner::kDraft;
  c.weight_version = "step-9";
  c.digest = "0123456789abcdef";
  c.tensors = {{"mtp.fc.weight", "00ff00ff00ff00ff", DType::kBFloat16, {16, 32}},
               {"mtp.norm.weight", "deadbeefdeadbeef", DType::kFloat32, {32}},
               {"mtp.step", "0000000000000001", DType::kInt64, {}}};
  return c;
}

// A change to a valid body: `value` written at the JSON pointer `pointer`; a refusal's message
// must start with `expected`.
struct Change {
  std::string pointer;
  Json value;
  std::string expected;
};

std::string changed(Json body, const Change& c) {
  body[Json::json_pointer(c.pointer)] = c.value;
  return body.dump();
}

// `parse` refuses each change of `valid` with a message starting with its `expected`.
template <typename Parse>
void expect_refused(const Json& valid, const std::vector<Change>& changes, Parse parse) {
  for (const Change& c : changes) {
    const std::string what = bad_request([&] { parse(changed(valid, c)); });
    EXPECT_EQ(what.rfind(c.expected, 0), 0u) << c.pointer << ": " << what;
  }
}

TEST(ProtocolResponse, RoundTripEveryBody) {
  for (const BasicResponse& b :
       {BasicResponse{true, ""}, BasicResponse{false, "rank 3 timed out"}}) {
    EXPECT_EQ(parse_basic_response(to_json_string(b)), b);
  }
  for (Selector s : kAllSelectors) {
    BeginWeightUpdateResponse b{true, "opened", s, "", "", "", "", "", 0, "", ""};
    EXPECT_EQ(parse_begin_weight_update_response(to_json_string(b)), b);
    b = {true,
         "opened",
         s,
         "0123456789abcdef0123456789abcdef",
         "host:42 weightcast",
         "7",
         "5f3a9c0e12b4d6785f3a9c0e12b4d678",
         "00112233445566778899aabbccddeeff",
         300,
         "3",
         "ffeeddccbbaa99887766554433221100"};
    EXPECT_EQ(parse_begin_weight_update_response(to_json_string(b)), b);
  }
  EndWeightUpdateResponse end{
      true, "committed", "step-9", {{Runner::kTarget, 291, 291}, {Runner::kDraft, 0, 12}}, "", ""};
  EXPECT_EQ(parse_end_weight_update_response(to_json_string(end)), end);
  end.runners.clear();
  EXPECT_EQ(parse_end_weight_update_response(to_json_string(end)), end);
  end.runner_digest = "00112233445566778899aabbccddeeff";
  EXPECT_EQ(parse_end_weight_update_response(to_json_string(end)), end);
  end.lora_digest = "ffeeddccbbaa99887766554433221100";
  EXPECT_EQ(parse_end_weight_update_response(to_json_string(end)), end);

  ServerInfoResponse info = sample_server_info();
  EXPECT_EQ(parse_server_info_response(to_json_string(info)), info);
  info.speculative_algorithm.reset();
  info.session_selector.reset();
  info.runners[0].filters.clear();
  EXPECT_EQ(parse_server_info_response(to_json_string(info)), info);

  WeightsChecksumResponse sum = sample_checksum();
  EXPECT_EQ(parse_weights_checksum_response(to_json_string(sum)), sum);
  // Names past the short-string buffer, sharing a long prefix: the list's uniqueness check must
  // compare the names themselves, not copies that are gone by the next entry.
  const auto first = sum.tensors.front();
  sum.tensors.clear();
  for (int e = 0; e < 40; ++e) {
    auto t = first;
    t.name = "model.layers.0.mlp.experts." + std::to_string(e) + ".gate_proj.weight";
    sum.tensors.push_back(t);
  }
  EXPECT_EQ(parse_weights_checksum_response(to_json_string(sum)), sum);
  sum.tensors.clear();
  EXPECT_EQ(parse_weights_checksum_response(to_json_string(sum)), sum);
}

TEST(ProtocolResponse, CommonPartMatchesSGLang) {
  // SGLang answers {"success": true, "message": "..."}; message may be missing.
  EXPECT_EQ(parse_basic_response(R"({"success":true,"message":"Succeeded"})"),
            (BasicResponse{true, "Succeeded"}));
  EXPECT_EQ(parse_basic_response(R"({"success":false})"), (BasicResponse{false, ""}));
  EXPECT_EQ(Json::parse(to_json_string(BasicResponse{false, "x"})),
            Json::parse(R"({"success":false,"message":"x"})"));
  // Unset optionals are written as null, as SGLang's server_info writes them.
  ServerInfoResponse info = sample_server_info();
  info.speculative_algorithm.reset();
  info.session_selector.reset();
  const Json j = Json::parse(to_json_string(info));
  EXPECT_TRUE(j.at("speculative_algorithm").is_null());
  EXPECT_TRUE(j.at("session_selector").is_null());
  EXPECT_EQ(j.at("tp_size"), 2);
  EXPECT_EQ(j.at("runners").at(1).at("layout"), "shuffle");
}

TEST(ProtocolResponse, MessagesMayCarryAnyText) {
  // Error messages quote bad input; writing them never throws, even for invalid UTF-8.
  const BasicResponse b{false, std::string("bad \xff byte \"quoted\"\n")};
  const std::string body = to_json_string(b);
  EXPECT_TRUE(parse_basic_response(body).message.find("quoted") != std::string::npos);
}

TEST(ProtocolResponse, MalformedServerInfo) {
  const Json valid = Json::parse(to_json_string(sample_server_info()));
  expect_refused(
      valid,
      {
          {"/success", "yes", "success: must be a boolean"},
          {"/message", 5, "message: must be a string"},
          {"/runners/0/name", "verifier", "runners[0].name: unknown runner 'verifier'"},
          {"/runners/1/name", "target", "runners[1]: duplicate of runners[0] ('target')"},
          {"/runners/0/filters", "model.*", "runners[0].filters: must be an array"},
          {"/runners/0/filters/0", "", "runners[0].filters[0]: must not be empty"},
          {"/runners/0/layout", "", "runners[0].layout: must not be empty"},
          {"/runners/0/tensor_count", -1, "runners[0].tensor_count: must be in [0, "},
          {"/runners/0", "target", "runners[0]: must be an object (got string)"},
          {"/selectors/1", "some", "selectors[1]: unknown selector 'some'"},
          {"/selectors/2", "all", "selectors[2]: duplicate of selectors[0]"},
          {"/backends/0", "mpi", "backends[0]: unknown backend 'mpi'"},
          {"/rank_count", 0, "rank_count: must be in [1, "},
          {"/tp_size", "2", "tp_size: must be an integer"},
          {"/weight_version", nullptr, "weight_version: must be a string"},
          {"/speculative_algorithm", 1, "speculative_algorithm: must be a string"},
          {"/session_selector", "none", "session_selector: unknown selector 'none'"},
          {"/shard_plans", "all", "shard_plans: must be a list"},
          {"/shard_plans", Json::array({Json::object()}),
           "shard_plans: 1 plans for rank_count 2 (one per engine rank)"},
          {"/shard_plans/1", "replicated", "shard_plans[1]: must be an object"},
      },
      [](const std::string& body) { parse_server_info_response(body); });
  Json missing = valid;
  missing.erase("version");
  EXPECT_EQ(bad_request([&] { parse_server_info_response(missing.dump()); }),
            "version: missing required field");
}

TEST(ProtocolResponse, MalformedChecksum) {
  const Json valid = Json::parse(to_json_string(sample_checksum()));
  expect_refused(valid,
                 {
                     {"/runner", "all", "runner: unknown runner 'all'"},
                     {"/digest", "ABCDEF", "digest: must be lower-case hex"},
                     {"/digest", "", "digest: must be 1 to 128 hex digits"},
                     {"/digest", std::string(129, 'a'), "digest: must be 1 to 128 hex digits"},
                     {"/tensors/0/digest", "xyz", "tensors[0].digest: must be lower-case hex"},
                     {"/tensors/1/name", "mtp.fc.weight", "tensors[1]: duplicate of tensors[0]"},
                     {"/tensors/2/dtype", "qint8", "tensors[2].dtype: unknown dtype 'qint8'"},
                     {"/tensors/0/shape/1", -32, "tensors[0].shape[1]: must be >= 0 (got -32)"},
                     {"/tensors/0/shape", Json::object(), "tensors[0].shape: must be an array"},
                     {"/weight_version", "", "weight_version: must not be empty"},
                 },
                 [](const std::string& body) { parse_weights_checksum_response(body); });
  // A torch alias is accepted, as its canonical dtype.
  EXPECT_EQ(parse_weights_checksum_response(changed(valid, {"/tensors/1/dtype", "float", ""}))
                .tensors[1]
                .dtype,
            DType::kFloat32);
}

TEST(ProtocolResponse, MalformedEndAndBegin) {
  EXPECT_EQ(bad_request([] {
              parse_end_weight_update_response(
                  R"({"success":true,"weight_version":"v","runners":[{"runner":"target",)"
                  R"("tensors_loaded":1,"tensors_transformed":1},{"runner":"target",)"
                  R"("tensors_loaded":1,"tensors_transformed":1}]})");
            }).rfind("runners[1]: duplicate of runners[0]", 0),
            0u);
  EXPECT_EQ(bad_request([] {
              parse_end_weight_update_response(
                  R"({"success":true,"weight_version":"v","runners":[{"runner":"draft",)"
                  R"("tensors_loaded":1}]})");
            }),
            "runners[0].tensors_transformed: missing required field");
  EXPECT_EQ(bad_request([] { parse_begin_weight_update_response(R"({"success":true})"); }),
            "selector: missing required field");
  EXPECT_EQ(bad_request([] { parse_basic_response(R"({"message":"m"})"); }),
            "success: missing required field");
}

TEST(ProtocolResponse, ListLimit) {
  ProtocolLimits limits;
  limits.max_list_entries = 2;
  const std::string what = bad_request(
      [&] { parse_weights_checksum_response(to_json_string(sample_checksum()), limits); });
  EXPECT_EQ(what.rfind("tensors: 3 entries, more than the limit of 2", 0), 0u) << what;
}

}  // namespace
}  // namespace weightcast::sync
