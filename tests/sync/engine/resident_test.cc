// Checks that must read the bytes a runner holds, not what was recorded about them: the
// recomputed checksum, and the probe cache that /flush_cache drops. Bytes are changed behind the
// stored digest through the tensor accessor (its views write to the runner's own memory), as
// memory corruption or a transform applied behind the runner's back would.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sync/engine/control/engine.h"
#include "sync/engine/runners/runner.h"
#include "sync/engine/runners/weights.h"
#include "sync/model/checksum.h"
#include "sync/model/model.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine {
namespace {

using testing::tensor;

// Flips one byte of `name` in `id` without touching its stored digest.
void flip_resident_byte(const RunnerSet& runners, Runner id, const std::string& name,
                        std::size_t offset) {
  ASSERT_TRUE(runners.with_tensor(id, name, [&](const ResidentTensor& t) {
    ASSERT_LT(offset, t.bytes.size());
    t.bytes.data()[offset] ^= std::byte{0x5a};
  }));
}

TEST(RunnerSetRecompute, SeesBytesChangedBehindTheStoredDigest) {
  RunnerConfig target{Runner::kTarget, NameFilter::parse("model.*"), Layout::kShuffle, {}, 0,
                      "generated"};
  RunnerSet runners({target}, "v0", 1);
  runners.load_initial(Runner::kTarget,
                       {tensor("model.a", {32, 64}, 0), tensor("model.b", {16, 96}, 0)});
  const RunnerChecksum stored = runners.checksum(Runner::kTarget);
  // Untouched, both agree.
  EXPECT_EQ(runners.checksum(Runner::kTarget, /*recompute=*/true).combined, stored.combined);

  flip_resident_byte(runners, Runner::kTarget, "model.a", 100);
  const RunnerChecksum still = runners.checksum(Runner::kTarget);
  const RunnerChecksum now = runners.checksum(Runner::kTarget, /*recompute=*/true);
  EXPECT_EQ(still.combined, stored.combined) << "the stored digest cannot see the change";
  EXPECT_NE(now.combined, stored.combined) << "recompute returned the stored digests";
  ASSERT_EQ(now.tensors.size(), 2u);
  Digest resident_a;
  runners.with_tensor(Runner::kTarget, "model.a",
                      [&](const ResidentTensor& t) { resident_a = tensor_digest(t.bytes); });
  EXPECT_EQ(now.tensors[0].name, "model.a");
  EXPECT_EQ(now.tensors[0].digest, resident_a);
  EXPECT_NE(now.tensors[0].digest, stored.tensors[0].digest);
  EXPECT_EQ(now.tensors[1].digest, stored.tensors[1].digest);  // model.b untouched
  EXPECT_EQ(now.weight_version, "v0");
}

// The unit tests' "tiny" model: without MTP layers its draft is an EAGLE head, so
// /spec_accept_length can run.
std::unique_ptr<Engine> eagle_engine() {
  const ModelSpec spec = model_preset("tiny");
  RunnerConfig target{
      Runner::kTarget, NameFilter::parse("model.*,lm_head.*"), Layout::kShuffle, {}, 0,
      "generated"};
  RunnerConfig draft{Runner::kDraft, NameFilter::parse("draft.*"), Layout::kShuffle, {}, 0,
                     "generated"};
  auto runners = std::make_unique<RunnerSet>(std::vector<RunnerConfig>{target, draft}, "v0", 1);
  runners->load_initial(Runner::kTarget,
                        generate_weights(runner_tensors(Runner::kTarget, spec), 3, 0));
  runners->load_initial(Runner::kDraft,
                        generate_weights(runner_tensors(Runner::kDraft, spec), 3, 0));
  return std::make_unique<Engine>(EngineOptions{}, std::move(runners));
}

nlohmann::json body_of(const Reply& reply) {
  EXPECT_EQ(reply.status, 200) << reply.body;
  return nlohmann::json::parse(reply.body);
}

TEST(EngineRecompute, WeightsChecksumRecomputeReportsTheResidentBytes) {
  auto engine = eagle_engine();
  const auto stored = body_of(engine->weights_checksum("draft"));
  EXPECT_FALSE(stored.at("recomputed").get<bool>());
  EXPECT_EQ(body_of(engine->weights_checksum("draft", true)).at("digest"), stored.at("digest"));

  flip_resident_byte(engine->runners(), Runner::kDraft, "draft.fc.weight", 7);
  EXPECT_EQ(body_of(engine->weights_checksum("draft")).at("digest"), stored.at("digest"));
  const auto now = body_of(engine->weights_checksum("draft", true));
  EXPECT_TRUE(now.at("recomputed").get<bool>());
  EXPECT_NE(now.at("digest"), stored.at("digest")) << "recompute returned the stored digest";
  engine->shutdown();
}

TEST(EngineFlushCache, DropsTheProbeAnswerSoTheNextProbeReadsTheWeights) {
  auto engine = eagle_engine();
  const double before = body_of(engine->spec_accept_length()).at("accept_length").get<double>();
  EXPECT_GT(before, 1.5) << "the generated draft head should help its target";

  // Zero the draft head behind its digest: the digests (the probe's cache key) do not change.
  ASSERT_TRUE(engine->runners().with_tensor(
      Runner::kDraft, "draft.fc.weight",
      [](const ResidentTensor& t) { std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0}); }));
  EXPECT_EQ(body_of(engine->spec_accept_length()).at("accept_length").get<double>(), before)
      << "cached while the digests are the same";

  EXPECT_EQ(engine->flush_cache().status, 200);
  const double after = body_of(engine->spec_accept_length()).at("accept_length").get<double>();
  EXPECT_LT(after, before) << "/flush_cache left the probe's cached answer in place";
  engine->shutdown();
}

}  // namespace
}  // namespace weightcast::sync::engine
