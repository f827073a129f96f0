// The engine driven the way a Miles trainer drives SGLang (docs/protocol.md, "Compatibility"):
// bucket requests without `sequence`, tensors one broadcast each (no load_format) or in SGLang's
// unpadded flattened bucket, SGLang's read routes, and init's optional rendezvous.
#include <gtest/gtest.h>

#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

// A bucket request as Miles writes it: SGLang's fields only.
std::string miles_bucket(const std::vector<RawTensor>& tensors, const std::string& version,
                         const char* load_format = nullptr) {
  Json names = Json::array(), dtypes = Json::array(), shapes = Json::array();
  for (const auto& t : tensors) {
    names.push_back(t.meta.name);
    dtypes.push_back(to_string(t.meta.dtype));
    shapes.push_back(t.meta.shape);
  }
  Json j = {{"names", names},           {"dtypes", dtypes},     {"shapes", shapes},
            {"group_name", "g"},        {"flush_cache", false}, {"selector", "all"},
            {"weight_version", version}};
  if (load_format) j["load_format"] = load_format;
  return j.dump();
}

class CompatTest : public EngineHttpFixture {
 protected:
  void open_session() {
    ASSERT_EQ(post("/pause_generation", R"({"mode":"retract"})").first, 200);
    ASSERT_EQ(get("/flush_cache").first, 200);
    ASSERT_EQ(post("/begin_weight_update", R"({"selector":"all"})").first, 200);
  }
  void commit(const std::string& version) {
    ASSERT_EQ(post("/update_weight_version",
                   R"({"new_version":")" + version + R"(","abort_all_requests":false})")
                  .first,
              200);
    ASSERT_EQ(post("/end_weight_update", "{}").first, 200);
    ASSERT_EQ(post("/continue_generation", "{}").first, 200);
  }
};

TEST_F(CompatTest, MilesSequencePerTensorWithoutSequenceNumbers) {
  start({}, "", /*ranks=*/2);
  join("g");
  const Snapshot before = snapshot();
  for (std::uint64_t step = 1; step <= 2; ++step) {
    const auto weights = target_weights(step);
    const std::string version = std::to_string(step);
    open_session();
    const std::vector<RawTensor> first(weights.begin(), weights.begin() + 2);
    const std::vector<RawTensor> rest(weights.begin() + 2, weights.end());
    for (const auto* bucket : {&first, &rest}) {
      for (const auto& t : *bucket) source_->broadcast(t.bytes);  // one per tensor
      auto [st, body] = post("/update_weights_from_distributed", miles_bucket(*bucket, version));
      ASSERT_EQ(st, 200) << body.dump();
      EXPECT_NE(body["message"].get<std::string>().find("Weight version updated to " + version),
                std::string::npos);
    }
    commit(version);
    const Snapshot after = snapshot();
    EXPECT_EQ(after.target_digest, to_string(expected_combined(weights, Layout::kShuffle)));
    EXPECT_EQ(after.draft_digest, before.draft_digest);
    EXPECT_EQ(after.weight_version, version);
  }
}

TEST_F(CompatTest, FlattenedBucketIsSGLangsUnpaddedLayout) {
  start();
  join("g");
  const auto weights = target_weights(1);
  std::vector<std::byte> flat;
  for (const auto& t : weights) flat.insert(flat.end(), t.bytes.begin(), t.bytes.end());
  open_session();
  source_->broadcast(flat);
  auto [st, body] =
      post("/update_weights_from_distributed", miles_bucket(weights, "1", "flattened_bucket"));
  ASSERT_EQ(st, 200) << body.dump();
  commit("1");
  EXPECT_EQ(snapshot().target_digest, to_string(expected_combined(weights, Layout::kShuffle)));
}

TEST_F(CompatTest, SGLangReadRoutes) {
  EngineOptions opts;
  opts.speculative_algorithm = "EAGLE";
  start(opts, "", /*ranks=*/2);
  EXPECT_EQ(get("/health_generate").first, 200);
  auto [st, version] = get("/get_weight_version");
  EXPECT_EQ(st, 200);
  EXPECT_EQ(version["weight_version"], "v0");
  auto [mst, model] = get("/model_info");
  EXPECT_EQ(mst, 200);
  EXPECT_EQ(model["weight_version"], "v0");
  EXPECT_TRUE(model["is_generation"].get<bool>());
  auto [ist, info] = get("/get_server_info");
  ASSERT_EQ(ist, 200);
  EXPECT_EQ(info["tp_size"], 2);
  EXPECT_EQ(info["dp_size"], 1);
  EXPECT_EQ(info["pp_size"], 1);
  EXPECT_EQ(info["speculative_algorithm"], "EAGLE");
  EXPECT_TRUE(info.contains("speculative_num_steps"));
  EXPECT_TRUE(info["internal_states"].is_array());
  EXPECT_EQ(info["weight_version"], "v0");
}

TEST_F(CompatTest, InitCarriesTheRendezvousOrLeavesItToDetection) {
  start();
  Json body = Json::parse(init_body("g"));
  ASSERT_EQ(post("/init_weights_update_group", body.dump()).first, 200);
  EXPECT_FALSE(source_->last_spec().rendezvous.has_value());
  body["rendezvous"] = "torch";
  ASSERT_EQ(post("/init_weights_update_group", body.dump()).first, 200);
  EXPECT_EQ(source_->last_spec().rendezvous, Rendezvous::kTorch);
  body["rendezvous"] = "mpi";
  auto [st, answer] = post("/init_weights_update_group", body.dump());
  EXPECT_EQ(st, 400);
  EXPECT_EQ(answer["message"].get<std::string>().rfind("rendezvous", 0), 0u) << answer.dump();
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
