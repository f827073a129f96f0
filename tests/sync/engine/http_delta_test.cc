// Delta buckets through the in-process server and the fake data plane (docs/protocol.md, "Delta
// buckets"): begin and end answer the digest of what the covered runners hold, which moves with
// every commit that changes bytes and with nothing else; a delta against the committed bytes
// commits exactly what the same bucket in full commits; a delta computed against other bytes or
// another version is refused with 409 naming both, and nothing is applied.
#include "sync/model/delta.h"
#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

class DeltaTest : public EngineHttpFixture {
 protected:
  // The target tensors at step 0 with every 97th byte flipped: what a training step might send.
  static std::vector<RawTensor> drifted() {
    auto tensors = target_weights(0);
    for (auto& t : tensors) {
      for (std::size_t i = 0; i < t.bytes.size(); i += 97) t.bytes[i] ^= std::byte{0x01};
    }
    return tensors;
  }

  // The request for bucket 0 of `next` as a delta against `base` (the bytes the sender believes
  // the engine holds at `base_version`); the payload is queued on the fake data plane.
  std::string delta_body(const std::vector<RawTensor>& next, const std::vector<RawTensor>& base,
                         const std::string& base_version) {
    return delta_bucket_body(next, base, base_version);
  }

  // A session in which a delta of drifted() against `base` at `base_version` is sent: it must be
  // refused with 409 and apply nothing. Returns the refusal's message and the engine's state
  // before and after.
  struct Refusal {
    std::string message;
    Snapshot before, after;
  };
  Refusal refused(const std::vector<RawTensor>& base, const std::string& base_version) {
    start();
    join("g");
    begin_target();
    Refusal out;
    out.before = snapshot();
    auto [status, body] =
        post("/update_weights_from_distributed", delta_body(drifted(), base, base_version));
    EXPECT_EQ(status, 409) << body.dump();
    out.message = body.value("message", "");
    out.after = snapshot();
    EXPECT_EQ(out.after.target_digest, out.before.target_digest) << "nothing was applied";
    return out;
  }

  // Opens a target session and returns the runner digest its answer carries.
  std::string begin_target() {
    auto [status, body] = post("/begin_weight_update", R"({"selector":"target"})");
    EXPECT_EQ(status, 200) << body.dump();
    return body.value("runner_digest", "");
  }

  // Sets `version`, commits, and returns the runner digest the commit answered.
  std::string commit(const std::string& version) {
    EXPECT_EQ(post("/update_weight_version", R"({"new_version":")" + version + R"("})").first, 200);
    auto [status, body] = post("/end_weight_update", "");
    EXPECT_EQ(status, 200) << body.dump();
    return body.value("runner_digest", "");
  }
};

TEST_F(DeltaTest, ADeltaCommitsExactlyWhatTheBucketInFullCommits) {
  start();
  join("g");
  const std::string before = begin_target();
  ASSERT_EQ(before.size(), 32u) << "begin answers the covered runners' digest";
  const Snapshot initial = snapshot();

  auto [status, body] =
      post("/update_weights_from_distributed", delta_body(drifted(), target_weights(0), "v0"));
  ASSERT_EQ(status, 200) << body.dump();
  const std::string after_delta = commit("v1");
  EXPECT_NE(after_delta, before) << "the commit changed the target's bytes";
  const Snapshot delta_applied = snapshot();
  EXPECT_NE(delta_applied.target_digest, initial.target_digest);
  EXPECT_EQ(delta_applied.draft_digest, initial.draft_digest) << "frozen draft untouched";

  // Nothing changed since: the next begin answers what the commit answered.
  EXPECT_EQ(begin_target(), after_delta);
  // The same bytes in full commit the same runner bytes, so the delta was exact.
  ASSERT_EQ(
      post("/update_weights_from_distributed", bucket_body(0, drifted(), Selector::kTarget)).first,
      200);
  EXPECT_EQ(commit("v2"), after_delta);
  EXPECT_EQ(snapshot().target_digest, delta_applied.target_digest);
}

TEST_F(DeltaTest, ADeltaAgainstBytesTheEngineDoesNotHoldIsRefusedNamingBothDigests) {
  const auto [message, before, after] = refused(target_weights(7), "v0");
  EXPECT_NE(message.find("the engine holds digest"), std::string::npos) << message;
  EXPECT_NE(message.find("computed against digest"), std::string::npos) << message;
  EXPECT_EQ(after.weight_version, before.weight_version);
  EXPECT_FALSE(after.in_session) << "the session is aborted";
}

TEST_F(DeltaTest, ADeltaAgainstAnotherVersionIsRefusedNamingBothVersions) {
  const auto [message, before, after] = refused(target_weights(0), "v9");
  EXPECT_NE(message.find("'v0'"), std::string::npos) << message;
  EXPECT_NE(message.find("'v9'"), std::string::npos) << message;
}

TEST_F(DeltaTest, RunnerDigestCoversTheSelectedRunnersAndAnAbortKeepsIt) {
  start();
  const std::string target = begin_target();
  ASSERT_EQ(post("/abort_weight_update", "{}").first, 200);
  EXPECT_EQ(begin_target(), target) << "an aborted session changed nothing";
  ASSERT_EQ(post("/abort_weight_update", "{}").first, 200);
  auto [status, body] = post("/begin_weight_update", R"({"selector":"all"})");
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_NE(body.value("runner_digest", ""), target) << "all covers the draft too";
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
