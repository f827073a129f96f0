// Checks that must read the bytes a runner holds, not what was recorded about them: the probe
// cache that /flush_cache drops. Bytes are changed behind the stored digest through the tensor
// accessor (its views write to the runner's own memory), as memory corruption or a transform
// applied behind the runner's back would.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sync/engine/engine.h"
#include "sync/engine/runner.h"
#include "sync/engine/weights.h"
#include "sync/model/checksum.h"
#include "sync/model/model.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine {
namespace {

// A small model whose draft is an EAGLE head, so /spec_accept_length can run.
ModelSpec eagle_spec() {
  ModelSpec s;
  s.vocab_size = 256;
  s.hidden_size = 64;
  s.num_layers = 1;
  s.num_attention_heads = 2;
  s.num_key_value_heads = 1;
  s.head_dim = 32;
  s.intermediate_size = 128;
  s.mtp_num_layers = 0;
  return s;
}

std::unique_ptr<Engine> eagle_engine() {
  const ModelSpec spec = eagle_spec();
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
