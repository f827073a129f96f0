// Request bodies: round trips through to_json_string/parse_*, SGLang field names and defaults,
// and a table of malformed bodies per route, each rejected with a message naming the field.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "comm/errors.h"
#include "sync/protocol/protocol.h"
#include "tests/sync/protocol/sample_bucket.h"

namespace weightcast::sync {
namespace {

using Json = nlohmann::json;

std::set<std::string> keys_of(const std::string& body) {
  std::set<std::string> keys;
  const Json j = Json::parse(body);
  for (const auto& [k, v] : j.items()) keys.insert(k);
  return keys;
}

TEST(ProtocolRequest, RoundTripEveryBody) {
  InitWeightsUpdateGroupRequest init{"trainer-0.cluster", 29500, 3, 9, "wc-pp_0", Backend::kGloo};
  EXPECT_EQ(parse_init_weights_update_group(to_json_string(init)), init);
  init.rendezvous = Rendezvous::kTorch;
  EXPECT_EQ(parse_init_weights_update_group(to_json_string(init)), init);
  init.ranks = {1, 3};  // shard-aware broadcast: two of the engine's ranks join
  EXPECT_EQ(parse_init_weights_update_group(to_json_string(init)), init);
  EXPECT_EQ(
      parse_init_weights_update_group(to_json_string(InitWeightsUpdateGroupRequest{
          "::1", 65535, 1, 2, std::string(kDefaultGroupName), Backend::kNccl})),
      (InitWeightsUpdateGroupRequest{"::1", 65535, 1, 2, "weight_update_group", Backend::kNccl}));

  for (const char* g : {"weight_update_group", "other"}) {
    DestroyWeightsUpdateGroupRequest d{g};
    EXPECT_EQ(parse_destroy_weights_update_group(to_json_string(d)), d);
  }
  for (PauseMode m : kAllPauseModes) {
    PauseGenerationRequest p{m};
    EXPECT_EQ(parse_pause_generation(to_json_string(p)), p);
  }
  for (bool b : {true, false}) {
    ContinueGenerationRequest c{b};
    EXPECT_EQ(parse_continue_generation(to_json_string(c)), c);
    UpdateWeightVersionRequest v{"v" + std::to_string(b), b};
    EXPECT_EQ(parse_update_weight_version(to_json_string(v)), v);
  }
  EXPECT_EQ(parse_flush_cache(to_json_string(FlushCacheRequest{})), FlushCacheRequest{});
  EXPECT_EQ(parse_end_weight_update(to_json_string(EndWeightUpdateRequest{})),
            EndWeightUpdateRequest{});
  for (Selector s : kAllSelectors) {
    BeginWeightUpdateRequest b{s};
    EXPECT_EQ(parse_begin_weight_update(to_json_string(b)), b);
  }

  UpdateWeightsFromDistributedRequest bucket = sample_bucket();
  EXPECT_EQ(parse_update_weights_from_distributed(to_json_string(bucket)), bucket);
  bucket.weight_version.reset();
  bucket.sequence = std::numeric_limits<std::uint64_t>::max();
  bucket.selector = Selector::kDraft;
  EXPECT_EQ(parse_update_weights_from_distributed(to_json_string(bucket)), bucket);
}

TEST(ProtocolRequest, FieldNamesAreSGLangs) {
  EXPECT_EQ(keys_of(to_json_string(InitWeightsUpdateGroupRequest{"h", 1, 1, 2})),
            (std::set<std::string>{"master_address", "master_port", "rank_offset", "world_size",
                                   "group_name", "backend"}));
  EXPECT_EQ(keys_of(to_json_string(sample_bucket())),
            (std::set<std::string>{"names", "dtypes", "shapes", "group_name", "flush_cache",
                                   "abort_all_requests", "weight_version", "load_format",
                                   "torch_empty_cache", "selector", "sequence"}));
  EXPECT_EQ(keys_of(to_json_string(UpdateWeightVersionRequest{"v"})),
            (std::set<std::string>{"new_version", "abort_all_requests"}));
  EXPECT_EQ(keys_of(to_json_string(PauseGenerationRequest{})), (std::set<std::string>{"mode"}));
  const Json j = Json::parse(to_json_string(sample_bucket()));
  EXPECT_EQ(j["load_format"], "weightcast_bucket");
  EXPECT_EQ(j["dtypes"], Json({"bfloat16", "float32", "float8_e4m3fn", "int64"}));
  EXPECT_EQ(j["shapes"], Json::parse("[[4,8],[8],[],[0,3]]"));
  EXPECT_FALSE(Json::parse(to_json_string(UpdateWeightsFromDistributedRequest{}))
                   .contains("weight_version"));
}

// The bucket request's body as nlohmann writes the same object (what to_json_string built before
// it wrote the text directly): keys sorted, compact, strings replaced where not UTF-8.
std::string dom_text(const UpdateWeightsFromDistributedRequest& r) {
  Json names = Json::array(), dtypes = Json::array(), shapes = Json::array();
  for (const TensorMeta& t : r.tensors) {
    names.push_back(t.name);
    dtypes.push_back(to_string(t.dtype));
    shapes.push_back(t.shape);
  }
  Json j = {{"names", names},
            {"dtypes", dtypes},
            {"shapes", shapes},
            {"group_name", r.group_name},
            {"flush_cache", r.flush_cache},
            {"abort_all_requests", r.abort_all_requests},
            {"torch_empty_cache", r.torch_empty_cache}};
  if (r.selector) j["selector"] = to_string(*r.selector);
  if (r.sequence) j["sequence"] = *r.sequence;
  if (r.load_format != LoadFormat::kPerTensor) j["load_format"] = to_string(r.load_format);
  if (r.weight_version) j["weight_version"] = *r.weight_version;
  if (r.session_id) j["session_id"] = *r.session_id;
  if (r.delta) {
    j["delta"] = {{"codec", to_string(r.delta->codec)},
                  {"wire_bytes", r.delta->wire_bytes},
                  {"base_version", r.delta->base_version},
                  {"base_digests", r.delta->base_digests}};
  }
  if (!r.digests.empty()) j["digests"] = r.digests;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

TEST(ProtocolRequest, BucketBodyIsTheTextNlohmannWrites) {
  std::vector<UpdateWeightsFromDistributedRequest> cases;
  cases.push_back(UpdateWeightsFromDistributedRequest{});
  cases.push_back(sample_bucket());
  UpdateWeightsFromDistributedRequest r = sample_bucket();
  r.load_format = LoadFormat::kPerTensor;
  r.selector.reset();
  r.sequence.reset();
  r.weight_version.reset();
  cases.push_back(r);
  r = sample_bucket();
  r.session_id = "s-\"quoted\"\\slash";
  r.weight_version = std::string("tab\there, newline\n, bell\x07, del\x7f, caf\xc3\xa9");
  r.group_name = "g";
  r.digests = {std::string(32, 'a'), std::string(32, '0'), std::string(32, 'F'), "x"};
  r.delta = BucketDelta{DeltaCodec::kXorZstd, 12345, "v\xff-not-utf8", {std::string(32, 'b')}};
  r.tensors.push_back({"odd \"name\" \xe2\x82\xac \x01", DType::kFloat16, {1, 2, 3, 4}});
  cases.push_back(r);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(to_json_string(cases[i]), dom_text(cases[i])) << "case " << i;
  }
  // The text parses back to the same request wherever the request is a valid one.
  EXPECT_EQ(parse_update_weights_from_distributed(to_json_string(cases[1])), cases[1]);
  EXPECT_EQ(parse_update_weights_from_distributed(to_json_string(cases[2])), cases[2]);
}

TEST(ProtocolRequest, SGLangDefaults) {
  const auto init = parse_init_weights_update_group(
      R"({"master_address":"10.0.0.1","master_port":29500,"rank_offset":1,"world_size":2})");
  EXPECT_EQ(init.group_name, "weight_update_group");
  EXPECT_EQ(init.backend, Backend::kNccl);
  EXPECT_EQ(parse_update_weight_version(R"({"new_version":"3"})").abort_all_requests, true);
  EXPECT_EQ(parse_pause_generation("{}").mode, PauseMode::kAbort);
  EXPECT_EQ(parse_pause_generation(R"({"mode":"in_place"})").mode, PauseMode::kInPlace);
  EXPECT_EQ(parse_pause_generation(R"({"mode":"retract"})").mode, PauseMode::kRetract);

  const auto b = parse_update_weights_from_distributed(
      R"({"names":["w"],"dtypes":["torch.bfloat16"],"shapes":[[2,3]],"selector":"all",)"
      R"("sequence":0,"rid":"ignored","load_format":null,"weight_version":null})");
  EXPECT_EQ(b.group_name, "weight_update_group");
  EXPECT_TRUE(b.flush_cache);
  EXPECT_FALSE(b.abort_all_requests);
  EXPECT_FALSE(b.torch_empty_cache);
  EXPECT_FALSE(b.weight_version.has_value());
  ASSERT_EQ(b.tensors.size(), 1u);
  EXPECT_EQ(b.tensors[0], (TensorMeta{"w", DType::kBFloat16, {2, 3}}));
  EXPECT_EQ(b.total_bytes(), 12u);
}

TEST(ProtocolRequest, BucketTotalBytesIsDerived) {
  EXPECT_EQ(sample_bucket().total_bytes(), 4u * 8 * 2 + 8 * 4 + 1 + 0);
  UpdateWeightsFromDistributedRequest r;
  r.tensors = {{"a", DType::kUInt8, {std::numeric_limits<std::int64_t>::max()}},
               {"b", DType::kUInt8, {std::numeric_limits<std::int64_t>::max()}},
               {"c", DType::kUInt8, {2}}};
  EXPECT_THROW((void)r.total_bytes(), comm::BadRequestError);
}

TEST(ProtocolRequest, BucketLimitsAppliedWhileParsing) {
  const std::string body = to_json_string(sample_bucket());  // 64 + 32 + 1 + 0 bytes
  ProtocolLimits limits;
  limits.max_bucket_bytes = 97;
  EXPECT_NO_THROW(parse_update_weights_from_distributed(body, limits));
  limits.max_bucket_bytes = 96;
  std::string what;
  try {
    parse_update_weights_from_distributed(body, limits);
  } catch (const comm::BadRequestError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("shapes[2]: bucket size through tensor 'lm_head.scale' exceeds the limit"),
            std::string::npos)
      << what;
  limits.max_bucket_bytes = 10;  // the first tensor alone is too big
  EXPECT_THROW(parse_update_weights_from_distributed(body, limits), comm::BadRequestError);

  // The refusal's message under limits of their defaults but one.
  const auto refusal = [&](std::size_t ProtocolLimits::*limit, std::size_t value) -> std::string {
    ProtocolLimits one;
    one.*limit = value;
    try {
      parse_update_weights_from_distributed(body, one);
      ADD_FAILURE() << "accepted";
    } catch (const comm::BadRequestError& e) {
      return e.what();
    }
    return "";
  };
  const std::string names = refusal(&ProtocolLimits::max_names_per_bucket, 3);
  EXPECT_NE(names.find("names: 4 entries, more than the limit of 3"), std::string::npos) << names;
  const std::string name = refusal(&ProtocolLimits::max_name_length, 20);
  EXPECT_EQ(name.rfind("names[0]: ", 0), 0u) << name;
}

// A claimed size far beyond memory is refused from the metadata alone.
TEST(ProtocolRequest, HugeClaimedShapeRefusedWithoutAllocation) {
  const std::string body =
      R"({"names":["w"],"dtypes":["float32"],"shapes":[[1099511627776,1024]],"selector":"all","sequence":0})";
  EXPECT_THROW(parse_update_weights_from_distributed(body), comm::BadRequestError);
}

// Delta buckets (ours): the "delta" object round-trips; it is refused with SGLang's formats,
// with a digest list that does not match the names, a zero or oversized payload, or a digest
// that is not 32 hex digits; each refusal names its field.
TEST(ProtocolRequest, DeltaBucketRoundTripsAndIsCheckedFieldByField) {
  UpdateWeightsFromDistributedRequest bucket = sample_bucket();
  bucket.load_format = LoadFormat::kWeightcastBucket;
  const std::string digest = "0123456789abcdef0123456789ABCDEF";
  bucket.delta = BucketDelta{DeltaCodec::kSparse, 1234, "step-6",
                             std::vector<std::string>(bucket.tensors.size(), digest)};
  EXPECT_EQ(parse_update_weights_from_distributed(to_json_string(bucket)), bucket);
  for (DeltaCodec codec : kAllDeltaCodecs) {
    bucket.delta->codec = codec;
    EXPECT_EQ(parse_update_weights_from_distributed(to_json_string(bucket)), bucket);
  }
  const auto refused = [](UpdateWeightsFromDistributedRequest r, const std::string& field) {
    try {
      parse_update_weights_from_distributed(to_json_string(r));
      ADD_FAILURE() << "accepted, expected a refusal naming " << field;
    } catch (const comm::BadRequestError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  auto r = bucket;
  r.load_format = LoadFormat::kFlattenedBucket;
  refused(r, "delta");
  r = bucket;
  r.delta->base_digests.pop_back();
  refused(r, "delta.base_digests");
  r = bucket;
  r.delta->base_digests[1] = "xyz";
  refused(r, "delta.base_digests[1]");
  r = bucket;
  r.delta->wire_bytes = 0;
  refused(r, "delta.wire_bytes");
  ProtocolLimits small;
  small.max_bucket_bytes = 1000;
  EXPECT_THROW(parse_update_weights_from_distributed(to_json_string(bucket), small),
               comm::BadRequestError);
  Json j = Json::parse(to_json_string(bucket));
  j["delta"]["codec"] = "gzip";
  EXPECT_THROW(parse_update_weights_from_distributed(j.dump()), comm::BadRequestError);
}

TEST(LoraBeginRequest, RoundTripsAndRefusesABadLoraObjectNamingTheField) {
  BeginWeightUpdateRequest req;
  req.selector = Selector::kTarget;
  req.lora = LoraBegin{"math", R"({"lora_alpha":8,"r":4,"target_modules":["q_proj"]})", true};
  const ProtocolLimits limits;
  EXPECT_EQ(parse_begin_weight_update(to_json_string(req), limits), req);
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"selector":"target","lora":[]})", "lora"},
           {R"({"selector":"target","lora":{"config":{}}})", "lora.lora_name"},
           {R"({"selector":"target","lora":{"lora_name":"m"}})", "lora.config"},
           {R"({"selector":"target","lora":{"lora_name":"m","config":[]}})", "lora.config"},
           {R"({"selector":"target","lora":{"lora_name":"m","config":{},"op":"merge"}})",
            "lora.op"}}) {
    try {
      parse_begin_weight_update(body, limits);
      ADD_FAILURE() << body << " was accepted";
    } catch (const comm::BadRequestError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_unload_lora_adapter(R"({"lora_name":"math"})", limits).lora_name, "math");
  EXPECT_THROW(parse_unload_lora_adapter("{}", limits), comm::BadRequestError);
}

}  // namespace
}  // namespace weightcast::sync
