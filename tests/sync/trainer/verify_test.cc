// The --verify expectations: runner mirrors start from the generator's step-0 weights laid out
// once, follow committed updates only where the selector and filter allow, and report every
// difference naming runner and tensor — including a frozen draft shuffled a second time.
#include "sync/trainer/verify.h"

#include <gtest/gtest.h>

#include "comm/errors.h"

namespace weightcast::sync::trainer {
namespace {

const std::uint64_t kSeed = 11;

ModelSpec spec() {
  return model_preset("tiny");
}

RunnerInfo draft_info() {
  return RunnerInfo{Runner::kDraft, {"draft.*"}, "shuffle", 0, std::nullopt};
}
RunnerInfo target_info() {
  return RunnerInfo{Runner::kTarget, {"model.*", "lm_head.*"}, "shuffle", 0, std::nullopt};
}

// What a correct engine reports for `metas` at `step`, laid out `times` times.
WeightsChecksumResponse engine_answer(Runner runner, const std::vector<TensorMeta>& metas,
                                      std::uint64_t step, int times) {
  WeightsChecksumResponse r;
  r.runner = runner;
  for (const auto& meta : metas) {
    std::vector<std::byte> bytes(meta.byte_count());
    fill_tensor(meta, kSeed, step, bytes);
    for (int i = 0; i < times; ++i) apply_layout(Layout::kShuffle, meta, bytes);
    r.tensors.push_back({meta.name, to_string(tensor_digest(bytes)), meta.dtype, meta.shape});
  }
  return r;
}

std::vector<HostTensor> generate(const std::vector<TensorMeta>& metas, std::uint64_t step) {
  std::vector<HostTensor> out;
  for (const auto& meta : metas) {
    HostTensor t{meta, std::vector<std::byte>(meta.byte_count())};
    fill_tensor(meta, kSeed, step, t.bytes);
    out.push_back(std::move(t));
  }
  return out;
}

TEST(RunnerMirror, InitialWeightsMatchACorrectEngine) {
  RunnerMirror draft(draft_info(), spec(), kSeed);
  EXPECT_TRUE(draft.compare(engine_answer(Runner::kDraft, draft_tensors(spec()), 0, 1)).empty());
  RunnerMirror target(target_info(), spec(), kSeed);
  EXPECT_TRUE(target.compare(engine_answer(Runner::kTarget, target_tensors(spec()), 0, 1)).empty());
}

// An engine started with another seed than the trainer's reports it; the mirror starts from the
// engine's initial weights, not the trainer's.
TEST(RunnerMirror, StartsFromTheSeedTheEngineReports) {
  RunnerInfo info = draft_info();
  info.seed = kSeed;
  RunnerMirror draft(info, spec(), kSeed + 1);
  EXPECT_TRUE(draft.compare(engine_answer(Runner::kDraft, draft_tensors(spec()), 0, 1)).empty());
  RunnerMirror trainer_seed(draft_info(), spec(), kSeed + 1);
  EXPECT_FALSE(
      trainer_seed.compare(engine_answer(Runner::kDraft, draft_tensors(spec()), 0, 1)).empty());
}

TEST(RunnerMirror, FrozenDraftShuffledTwiceIsNamed) {
  RunnerMirror draft(draft_info(), spec(), kSeed);
  const auto problems = draft.compare(engine_answer(Runner::kDraft, draft_tensors(spec()), 0, 2));
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("runner draft tensor draft."), std::string::npos) << problems[0];
}

TEST(RunnerMirror, FollowsOnlyCoveredRunnersAndAcceptedNames) {
  const auto sent_tensors = generate(hf_tensors(spec()), 1);
  const auto sent = sent_digests(views(sent_tensors));
  RunnerMirror target(target_info(), spec(), kSeed);
  RunnerMirror draft(draft_info(), spec(), kSeed);
  for (Selector selector : {Selector::kTarget, Selector::kAll}) {
    target.apply(selector, sent);
    draft.apply(selector, sent);  // covered by kAll, but its filter accepts no sent name
  }
  EXPECT_TRUE(target.compare(engine_answer(Runner::kTarget, target_tensors(spec()), 1, 1)).empty());
  EXPECT_FALSE(
      target.compare(engine_answer(Runner::kTarget, target_tensors(spec()), 0, 1)).empty());
  EXPECT_TRUE(draft.compare(engine_answer(Runner::kDraft, draft_tensors(spec()), 0, 1)).empty());

  RunnerMirror untouched(target_info(), spec(), kSeed);
  untouched.apply(Selector::kDraft, sent);
  EXPECT_TRUE(
      untouched.compare(engine_answer(Runner::kTarget, target_tensors(spec()), 0, 1)).empty());
}

TEST(RunnerMirror, MissingAndUnexpectedTensorsAreReported) {
  RunnerMirror target(target_info(), spec(), kSeed);
  auto answer = engine_answer(Runner::kTarget, target_tensors(spec()), 0, 1);
  const std::string dropped = answer.tensors.back().name;
  answer.tensors.pop_back();
  answer.tensors.push_back({"model.extra.weight", std::string(32, '0'), DType::kFloat32, {1}});
  const auto problems = target.compare(answer);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find(dropped + ": missing"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("model.extra.weight: not expected"), std::string::npos) << problems[1];
}

TEST(SentDigests, TextRoundTrips) {
  const auto tensors = generate(draft_tensors(spec()), 2);
  const auto digests = sent_digests(views(tensors));
  EXPECT_EQ(parse_sent_digests(to_text(digests)), digests);
  EXPECT_THROW(parse_sent_digests("[[1]]"), comm::BadRequestError);
}

}  // namespace
}  // namespace weightcast::sync::trainer
