// Digests of the new bytes (docs/protocol.md, "Digests of the new bytes"): a bucket request may
// carry each tensor's digest, and the engine checks it once the bucket is decoded, before
// staging. A decoder bug is made on purpose here: this binary defines the engine's weak test hook
// (sync/engine/receive/receive_pipeline.h, test_hooks::after_delta_decode), which flips a byte of
// one tensor right after a delta is decoded. The bucket must fail naming that tensor, and nothing
// may commit. This is its own test binary so the hook exists nowhere else.
#include <atomic>
#include <mutex>

#include "sync/engine/receive/receive_pipeline.h"
#include "sync/model/delta.h"
#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine {
namespace {

std::mutex corrupt_mu;
std::string corrupt_tensor;  // empty: the hook does nothing

}  // namespace

// The engine's test hook: flips the first byte of `corrupt_tensor` in the decoded bucket.
void test_hooks::after_delta_decode(const BucketPlan& plan, std::span<std::byte> bucket) {
  std::lock_guard lock(corrupt_mu);
  for (const BucketEntry& e : plan.entries) {
    if (e.meta.name == corrupt_tensor && e.bytes > 0) bucket[e.offset] ^= std::byte{0x40};
  }
}

namespace testing {
namespace {

class DigestTest : public EngineHttpFixture {
 protected:
  void TearDown() override {
    std::lock_guard lock(corrupt_mu);
    corrupt_tensor.clear();
    EngineHttpFixture::TearDown();
  }

  static std::vector<RawTensor> drifted() {
    auto tensors = target_weights(0);
    for (auto& t : tensors) {
      for (std::size_t i = 0; i < t.bytes.size(); i += 89) t.bytes[i] ^= std::byte{0x01};
    }
    return tensors;
  }

  // Bucket 0 of `next` in full, carrying `digests`.
  std::string full_body(const std::vector<RawTensor>& next, std::vector<std::string> digests) {
    auto j = Json::parse(bucket_body(0, next, Selector::kTarget));
    j["digests"] = std::move(digests);
    return j.dump();
  }

  // Bucket 0 of `next` as a delta against `base` at v0, carrying the digests of `next`.
  std::string delta_body(const std::vector<RawTensor>& next, const std::vector<RawTensor>& base) {
    return delta_bucket_body(next, base, "v0", digests_of(next));
  }

  void begin_target() {
    ASSERT_EQ(post("/begin_weight_update", R"({"selector":"target"})").first, 200);
  }
  std::pair<int, Json> commit(const std::string& version) {
    EXPECT_EQ(post("/update_weight_version", R"({"new_version":")" + version + R"("})").first, 200);
    return post("/end_weight_update", "");
  }
};

TEST_F(DigestTest, ADeltaThatDecodesWrongFailsNamingTheTensorAndNothingCommits) {
  start();
  join("g");
  begin_target();
  ASSERT_EQ(post("/update_weights_from_distributed",
                 full_body(target_weights(0), digests_of(target_weights(0))))
                .first,
            200);
  ASSERT_EQ(commit("v0").first, 200);
  const Snapshot before = snapshot();

  const std::string victim = target_weights(0).at(1).meta.name;
  {
    std::lock_guard lock(corrupt_mu);
    corrupt_tensor = victim;
  }
  begin_target();
  auto [status, body] =
      post("/update_weights_from_distributed", delta_body(drifted(), target_weights(0)));
  EXPECT_EQ(status, 500) << body.dump();
  const std::string message = body.value("message", "");
  EXPECT_NE(message.find("tensor '" + victim + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("after decoding the delta"), std::string::npos) << message;
  EXPECT_NE(post("/end_weight_update", "").first, 200)
      << "a session with a bucket that failed its digests commits";
  const Snapshot after = snapshot();
  EXPECT_EQ(after.target_digest, before.target_digest) << "nothing committed";
  EXPECT_EQ(after.weight_version, "v0");
  EXPECT_FALSE(after.in_session);

  // The same delta without the fault commits: the check passes exact bytes. A failed session
  // leaves its group aborted, as any data-plane failure does: the trainer joins it again.
  {
    std::lock_guard lock(corrupt_mu);
    corrupt_tensor.clear();
  }
  ASSERT_EQ(post("/destroy_weights_update_group", R"({"group_name":"g"})").first, 200);
  join("g");
  begin_target();
  auto [ok_status, ok_body] =
      post("/update_weights_from_distributed", delta_body(drifted(), target_weights(0)));
  ASSERT_EQ(ok_status, 200) << ok_body.dump();
  EXPECT_EQ(commit("v1").first, 200);
  EXPECT_NE(snapshot().target_digest, before.target_digest);
}

TEST_F(DigestTest, AFullBucketWhoseBytesDoNotMatchItsDigestsFailsAndNothingCommits) {
  start();
  join("g");
  const Snapshot before = snapshot();
  begin_target();
  auto digests = digests_of(drifted());
  const std::string victim = drifted().at(0).meta.name;
  digests[0] = digests_of(target_weights(3))[0];  // what a trainer-side packing error would send
  auto [status, body] = post("/update_weights_from_distributed", full_body(drifted(), digests));
  EXPECT_EQ(status, 500) << body.dump();
  const std::string message = body.value("message", "");
  EXPECT_NE(message.find("tensor '" + victim + "'"), std::string::npos) << message;
  EXPECT_NE(post("/end_weight_update", "").first, 200);
  EXPECT_EQ(snapshot().target_digest, before.target_digest);
  EXPECT_EQ(snapshot().weight_version, before.weight_version);
}

TEST_F(DigestTest, DigestsAreOptionalAndCheckedForEveryTensor) {
  start();
  join("g");
  begin_target();
  // Without digests (SGLang and Miles send none) the bucket is taken as before.
  ASSERT_EQ(
      post("/update_weights_from_distributed", bucket_body(0, drifted(), Selector::kTarget)).first,
      200);
  ASSERT_EQ(commit("v1").first, 200);
  // A list whose length is not the tensors' is refused before anything is received.
  begin_target();
  auto digests = digests_of(target_weights(0));
  digests.pop_back();
  auto j = Json::parse(bucket_body(0, target_weights(0), Selector::kTarget, "g", false));
  j["digests"] = digests;
  auto [status, body] = post("/update_weights_from_distributed", j.dump());
  EXPECT_EQ(status, 400) << body.dump();
  EXPECT_NE(body.value("message", "").find("digests"), std::string::npos) << body.dump();
}

}  // namespace
}  // namespace testing
}  // namespace weightcast::sync::engine
