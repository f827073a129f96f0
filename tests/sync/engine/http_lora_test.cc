// LoRA adapters on weightcast-engine's routes (docs/lora.md): begin_weight_update with "lora"
// opens an adapter session; its buckets carry the adapter's LoRA tensors over the data plane; end
// swaps the adapter in and loads no runner; /server_info lists it, /weights_checksum?lora=NAME
// reports its digests, /unload_lora_adapter drops it. Refusals change nothing. A bucket may be a
// delta against the adapter held under the session's name (begin answers its version and digest),
// which commits exactly what the bucket in full commits; a delta against anything else is refused.
#include "sync/model/lora.h"
#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

const std::string kModule = "model.layers.0.self_attn.q_proj";

class LoraHttpTest : public EngineHttpFixture {
 protected:
  void SetUp() override {
    extra_target_ = {tensor(kModule + ".weight", {48, 64}, 0)};
    start();
    join("g");
  }

  static std::vector<RawTensor> adapter(std::uint64_t step, int r = 4) {
    return {tensor(lora_tensor_name(kModule, LoraPart::kA), {r, 64}, step),
            tensor(lora_tensor_name(kModule, LoraPart::kB), {48, r}, step)};
  }

  static std::string begin_body(const std::string& selector, const std::string& op = "load",
                                const std::string& name = "math") {
    return R"({"selector":")" + selector + R"(","lora":{"lora_name":")" + name +
           R"(","config":{"r":4,"lora_alpha":8,"target_modules":["q_proj"]},"op":")" + op +
           R"("}})";
  }

  // begin, one bucket of `tensors`, version, end: the end's status and body.
  std::pair<int, Json> adapter_update(const std::vector<RawTensor>& tensors, const std::string& op,
                                      const std::string& version) {
    auto [st, begun] = post("/begin_weight_update", begin_body("target", op));
    EXPECT_EQ(st, 200) << begun.dump();
    const std::string sid = begun.value("session_id", "");
    auto [bst, bucket] =
        post("/update_weights_from_distributed", bucket_body(0, tensors, Selector::kTarget));
    EXPECT_EQ(bst, 200) << bucket.dump();
    EXPECT_EQ(post("/update_weight_version",
                   R"({"new_version":")" + version + R"(","session_id":")" + sid + R"("})")
                  .first,
              200);
    return post("/end_weight_update", R"({"session_id":")" + sid + R"("})");
  }
};

TEST_F(LoraHttpTest, AnAdapterUpdateCommitsTheAdapterAndLeavesBaseAndDraftAsTheyWere) {
  const Snapshot before = snapshot();
  const auto tensors = adapter(1);
  auto [st, end] = adapter_update(tensors, "load", "a1");
  ASSERT_EQ(st, 200) << end.dump();
  EXPECT_NE(end.value("message", "").find("adapter 'math' committed"), std::string::npos)
      << end.dump();
  EXPECT_EQ(snapshot(), before) << "the base, its version or the draft changed";
  auto [ist, info] = get("/server_info");
  ASSERT_EQ(info["lora_adapters"].size(), 1u) << info.dump();
  EXPECT_EQ(info["lora_adapters"][0]["lora_name"], "math");
  EXPECT_EQ(info["lora_adapters"][0]["version"], "a1");
  EXPECT_EQ(info["lora_adapters"][0]["config"]["r"], 4);
  auto [cst, sums] = get("/weights_checksum?lora=math");
  ASSERT_EQ(cst, 200) << sums.dump();
  std::map<std::string, std::string> held;
  for (const auto& t : sums["tensors"]) held[t["name"]] = t["digest"];
  for (const auto& t : tensors) {
    EXPECT_EQ(held[t.meta.name], to_string(tensor_digest(t.bytes))) << t.meta.name;
  }
  EXPECT_EQ(get("/weights_checksum?lora=other").first, 404);
  EXPECT_EQ(post("/unload_lora_adapter", R"({"lora_name":"math"})").first, 200);
  EXPECT_EQ(post("/unload_lora_adapter", R"({"lora_name":"math"})").first, 404);
  EXPECT_EQ(get("/weights_checksum?lora=math").first, 404);
  EXPECT_EQ(snapshot(), before);
}

TEST_F(LoraHttpTest, RefusedAdapterRequestsChangeNothing) {
  ASSERT_EQ(adapter_update(adapter(1), "load", "a1").first, 200);
  const Snapshot before = snapshot();
  const std::string digest = get("/weights_checksum?lora=math").second.value("digest", "");
  // A draft or all selector: 400, nothing opens.
  for (const char* selector : {"draft", "all"}) {
    auto [st, body] = post("/begin_weight_update", begin_body(selector));
    EXPECT_EQ(st, 400) << body.dump();
    EXPECT_NE(body.dump().find("target model only"), std::string::npos) << body.dump();
    EXPECT_EQ(snapshot(), before);
  }
  // A bad config or op: 400 naming the field.
  auto [cst, cbody] = post("/begin_weight_update",
                           R"({"selector":"target","lora":{"lora_name":"x","config":{"r":0}}})");
  EXPECT_EQ(cst, 400);
  EXPECT_NE(cbody.dump().find("config.r"), std::string::npos) << cbody.dump();
  EXPECT_EQ(post("/begin_weight_update", begin_body("target", "merge")).first, 400);
  EXPECT_EQ(snapshot(), before);
  // A base tensor in an adapter session: 400 before anything is received.
  auto [bst, begun] = post("/begin_weight_update", begin_body("target", "upsert"));
  ASSERT_EQ(bst, 200);
  auto [rst, refused] = post("/update_weights_from_distributed",
                             bucket_body(0, {target_weights(2)[0]}, Selector::kTarget, "g",
                                         /*queue_bytes=*/false));
  EXPECT_EQ(rst, 400);
  EXPECT_NE(refused.dump().find("is not a LoRA tensor"), std::string::npos) << refused.dump();
  EXPECT_EQ(
      post("/abort_weight_update", R"({"session_id":")" + begun.value("session_id", "") + R"("})")
          .first,
      200);
  // An adapter whose shapes do not fit (rank 8 for a rank-4 config): end fails, the held one stays.
  auto [est, ended] = adapter_update(adapter(3, /*r=*/8), "upsert", "a3");
  EXPECT_EQ(est, 400) << ended.dump();
  EXPECT_EQ(get("/weights_checksum?lora=math").second.value("digest", ""), digest);
  // A second load of a held name: 409, the held one stays; upsert replaces it.
  EXPECT_EQ(adapter_update(adapter(4), "load", "a4").first, 409);
  EXPECT_EQ(get("/weights_checksum?lora=math").second.value("digest", ""), digest);
  EXPECT_EQ(adapter_update(adapter(5), "upsert", "a5").first, 200);
  EXPECT_NE(get("/weights_checksum?lora=math").second.value("digest", ""), digest);
  EXPECT_EQ(snapshot(), before);
}

TEST_F(LoraHttpTest, AnAdapterDeltaCommitsExactlyWhatTheAdapterInFullCommits) {
  ASSERT_EQ(adapter_update(adapter(1), "load", "a1").first, 200);
  const Snapshot before = snapshot();
  const std::string held = get("/weights_checksum?lora=math").second.value("digest", "");
  ASSERT_EQ(held.size(), 32u);
  auto next = adapter(1);
  for (auto& t : next) {
    for (std::size_t i = 0; i < t.bytes.size(); i += 13) t.bytes[i] ^= std::byte{0x01};
  }
  // begin answers the held adapter's version and digest: the base a trainer's delta is against.
  auto [st, begun] = post("/begin_weight_update", begin_body("target", "upsert"));
  ASSERT_EQ(st, 200) << begun.dump();
  EXPECT_EQ(begun.value("lora_version", ""), "a1");
  EXPECT_EQ(begun.value("lora_digest", ""), held);
  const std::string sid = begun.value("session_id", "");
  auto [bst, bucket] =
      post("/update_weights_from_distributed", delta_bucket_body(next, adapter(1), "a1"));
  ASSERT_EQ(bst, 200) << bucket.dump();
  ASSERT_EQ(
      post("/update_weight_version", R"({"new_version":"a2","session_id":")" + sid + R"("})").first,
      200);
  auto [est, ended] = post("/end_weight_update", R"({"session_id":")" + sid + R"("})");
  ASSERT_EQ(est, 200) << ended.dump();
  const std::string after = ended.value("lora_digest", "");
  EXPECT_NE(after, held);
  auto [cst, sums] = get("/weights_checksum?lora=math");
  EXPECT_EQ(sums.value("digest", ""), after);
  EXPECT_EQ(sums.value("version", ""), "a2");
  std::map<std::string, std::string> digests;
  for (const auto& t : sums["tensors"]) digests[t["name"]] = t["digest"];
  for (const auto& t : next) {
    EXPECT_EQ(digests[t.meta.name], to_string(tensor_digest(t.bytes))) << t.meta.name;
  }
  EXPECT_EQ(snapshot(), before) << "the base, its version or the draft changed";
  // The same adapter in full: the same digest.
  ASSERT_EQ(adapter_update(next, "upsert", "a3").first, 200);
  EXPECT_EQ(get("/weights_checksum?lora=math").second.value("digest", ""), after);
}

TEST_F(LoraHttpTest, AnAdapterDeltaAgainstAnythingButTheHeldAdapterIsRefused) {
  ASSERT_EQ(adapter_update(adapter(1), "load", "a1").first, 200);
  const std::string held = get("/weights_checksum?lora=math").second.value("digest", "");
  struct Case {
    std::string name;             // the session's adapter
    std::vector<RawTensor> base;  // what the delta was computed against
    std::string base_version;
    std::string says;  // in the refusal
  };
  for (const Case& c :
       {Case{"math", adapter(7), "a1", "computed against digest"},
        Case{"math", adapter(1), "a0", "'a0'"}, Case{"code", adapter(1), "a1", "no delta base"}}) {
    auto [st, begun] = post("/begin_weight_update", begin_body("target", "upsert", c.name));
    ASSERT_EQ(st, 200) << begun.dump();
    auto [bst, body] = post("/update_weights_from_distributed",
                            delta_bucket_body(adapter(2), c.base, c.base_version));
    EXPECT_EQ(bst, 409) << body.dump();
    EXPECT_NE(body.value("message", "").find(c.says), std::string::npos) << body.dump();
    post("/abort_weight_update", R"({"session_id":")" + begun.value("session_id", "") + R"("})");
    EXPECT_EQ(get("/weights_checksum?lora=math").second.value("digest", ""), held) << c.says;
    EXPECT_EQ(get("/weights_checksum?lora=code").first, 404);
  }
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
