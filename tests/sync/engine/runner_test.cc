// RunnerSet, Staging, auth and safetensors: the runner logic without sockets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "comm/errors.h"
#include "sync/engine/http/auth.h"
#include "sync/engine/runners/runner.h"
#include "sync/engine/runners/weights.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine {
namespace {

using testing::expected_combined;
using testing::laid_out;
using testing::tensor;

TEST(Auth, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secret", "secreT"));
  EXPECT_FALSE(constant_time_equal("secret", "secret2"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

TEST(Auth, BearerHeader) {
  EXPECT_EQ(check_bearer(std::nullopt, ""), AuthResult::kOk);
  EXPECT_EQ(check_bearer(std::nullopt, "t"), AuthResult::kMissing);
  EXPECT_EQ(check_bearer("Basic dDp0", "t"), AuthResult::kMissing);
  EXPECT_EQ(check_bearer("Bearer t", "t"), AuthResult::kOk);
  EXPECT_EQ(check_bearer("bearer t", "t"), AuthResult::kOk);
  EXPECT_EQ(check_bearer("Bearer u", "t"), AuthResult::kWrong);
  EXPECT_EQ(check_bearer("Bearer ", "t"), AuthResult::kWrong);
  EXPECT_EQ(http_status(AuthResult::kMissing), 401);
  EXPECT_EQ(http_status(AuthResult::kWrong), 403);
}

// A target and a frozen draft, both shuffled, as in the bug report.
class RunnerSetTest : public ::testing::Test {
 protected:
  void SetUp() override { reset(/*rank_count=*/1); }

  void reset(int rank_count) {
    RunnerConfig target{Runner::kTarget, NameFilter::parse("model.*"), Layout::kShuffle, {}, 0,
                        "generated"};
    RunnerConfig draft{Runner::kDraft, NameFilter::parse("mtp.*"), Layout::kShuffle, {}, 0,
                       "generated"};
    runners_ =
        std::make_unique<RunnerSet>(std::vector<RunnerConfig>{target, draft}, "v0", rank_count);
    target0_ = {tensor("model.a", {32, 64}, 0), tensor("model.norm", {64}, 0)};
    draft0_ = {tensor("draft.fc", {16, 64}, 0), tensor("draft.b", {48, 32}, 0)};
    runners_->load_initial(Runner::kTarget, target0_);
    runners_->load_initial(Runner::kDraft, draft0_);
  }

  // Stages `tensors` for every destination under `selector`, from every rank.
  void stage(Staging& staging, Selector selector, const std::vector<RawTensor>& tensors) {
    for (const auto& t : tensors) {
      for (Runner r : runners_->destinations(selector, t.meta.name)) {
        for (int rank = 0; rank < staging.rank_count(); ++rank) {
          staging.stage(r, rank, t.meta, t.bytes);
        }
      }
    }
  }

  std::unique_ptr<RunnerSet> runners_;
  std::vector<RawTensor> target0_, draft0_;
};

TEST_F(RunnerSetTest, InitialWeightsAreLaidOut) {
  EXPECT_EQ(runners_->checksum(Runner::kTarget).combined,
            expected_combined(target0_, Layout::kShuffle));
  EXPECT_EQ(runners_->checksum(Runner::kDraft).combined,
            expected_combined(draft0_, Layout::kShuffle));
  EXPECT_NE(expected_combined(target0_, Layout::kShuffle),
            expected_combined(target0_, Layout::kNone))
      << "the test tensors must be changed by the shuffle";
}

TEST_F(RunnerSetTest, DestinationsFollowSelectorAndFilter) {
  using V = std::vector<Runner>;
  EXPECT_EQ(runners_->destinations(Selector::kAll, "model.a"), V{Runner::kTarget});
  EXPECT_EQ(runners_->destinations(Selector::kAll, "mtp.x"), V{Runner::kDraft});
  EXPECT_EQ(runners_->destinations(Selector::kTarget, "mtp.x"), V{});
  EXPECT_EQ(runners_->destinations(Selector::kDraft, "model.a"), V{});
  EXPECT_EQ(runners_->destinations(Selector::kAll, "other"), V{});
}

TEST_F(RunnerSetTest, SafeCommitTransformsOnlyLoadedTensors) {
  const std::vector<RawTensor> sent = {tensor("model.a", {32, 64}, 1),
                                       tensor("model.norm", {64}, 1)};
  const Digest draft_before = runners_->checksum(Runner::kDraft).combined;
  for (int step = 0; step < 3; ++step) {
    Staging staging(1);
    stage(staging, Selector::kAll, sent);
    auto report = runners_->commit(staging, Selector::kAll, "v" + std::to_string(step + 1),
                                   /*legacy_finalize=*/false);
    ASSERT_EQ(report.size(), 2u);
    EXPECT_EQ(report[0].runner, Runner::kTarget);
    EXPECT_EQ(report[0].tensors_loaded, 2u);
    EXPECT_EQ(report[0].tensors_transformed, 2u);
    EXPECT_EQ(report[1].runner, Runner::kDraft);
    EXPECT_EQ(report[1].tensors_loaded, 0u);
    EXPECT_EQ(report[1].tensors_transformed, 0u);
  }
  EXPECT_EQ(runners_->checksum(Runner::kDraft).combined, draft_before);
  EXPECT_EQ(runners_->checksum(Runner::kTarget).combined,
            expected_combined(sent, Layout::kShuffle));
  EXPECT_EQ(runners_->weight_version(), "v3");
  bool found = runners_->with_tensor(Runner::kTarget, "model.a", [&](const ResidentTensor& t) {
    EXPECT_EQ(t.bytes.to_vector(), laid_out(sent[0], Layout::kShuffle));
    EXPECT_TRUE(t.laid_out);
  });
  EXPECT_TRUE(found);
}

TEST_F(RunnerSetTest, LegacyCommitReshufflesTheFrozenDraft) {
  const std::vector<RawTensor> sent = {tensor("model.a", {32, 64}, 1)};
  const Digest draft_before = runners_->checksum(Runner::kDraft).combined;
  Staging staging(1);
  stage(staging, Selector::kAll, sent);
  auto report = runners_->commit(staging, Selector::kAll, std::nullopt, /*legacy_finalize=*/true);
  ASSERT_EQ(report.size(), 2u);
  EXPECT_EQ(report[1].tensors_loaded, 0u);
  EXPECT_EQ(report[1].tensors_transformed, 2u) << "legacy re-processes resident draft tensors";
  EXPECT_NE(runners_->checksum(Runner::kDraft).combined, draft_before);
  // The draft now holds shuffle(shuffle(w)) for its full-tile tensors: the bug.
  runners_->with_tensor(Runner::kDraft, "draft.b", [&](const ResidentTensor& t) {
    auto twice = laid_out(draft0_[1], Layout::kShuffle);
    apply_layout(Layout::kShuffle, t.meta, twice);
    EXPECT_EQ(t.bytes.to_vector(), twice);
  });
  EXPECT_EQ(runners_->weight_version(), "v0") << "no version given: unchanged";
}

TEST_F(RunnerSetTest, LegacyWithTargetSelectorLeavesDraftAlone) {
  const Digest draft_before = runners_->checksum(Runner::kDraft).combined;
  Staging staging(1);
  stage(staging, Selector::kTarget, {tensor("model.a", {32, 64}, 1)});
  runners_->commit(staging, Selector::kTarget, std::nullopt, /*legacy_finalize=*/true);
  EXPECT_EQ(runners_->checksum(Runner::kDraft).combined, draft_before);
}

TEST_F(RunnerSetTest, RanksMustAgreeOrNothingChanges) {
  reset(/*rank_count=*/2);
  const Digest target_before = runners_->checksum(Runner::kTarget).combined;
  const RawTensor good = tensor("model.a", {32, 64}, 1);
  RawTensor bad = good;
  bad.bytes[5] ^= std::byte{1};
  Staging staging(2);
  staging.stage(Runner::kTarget, 0, good.meta, good.bytes);
  staging.stage(Runner::kTarget, 1, bad.meta, bad.bytes);
  try {
    runners_->commit(staging, Selector::kTarget, "v9", false);
    FAIL() << "commit must refuse ranks that disagree";
  } catch (const comm::PeerError& e) {
    EXPECT_EQ(e.peer(), "engine rank 1");
    EXPECT_NE(std::string(e.what()).find("model.a"), std::string::npos);
  }
  EXPECT_EQ(runners_->checksum(Runner::kTarget).combined, target_before);
  EXPECT_EQ(runners_->weight_version(), "v0");
}

TEST_F(RunnerSetTest, MissingRankIsRefused) {
  reset(/*rank_count=*/2);
  const RawTensor good = tensor("model.a", {32, 64}, 1);
  Staging staging(2);
  staging.stage(Runner::kTarget, 0, good.meta, good.bytes);
  EXPECT_THROW(runners_->commit(staging, Selector::kTarget, std::nullopt, false), comm::PeerError);
}

TEST_F(RunnerSetTest, AgreeingRanksReportTheirStagedDigests) {
  reset(/*rank_count=*/2);
  const std::vector<RawTensor> sent = {tensor("model.a", {32, 64}, 2)};
  Staging staging(2);
  stage(staging, Selector::kTarget, sent);
  EXPECT_EQ(staging.staged_bytes(), sent[0].bytes.size()) << "only rank 0 keeps bytes";
  runners_->commit(staging, Selector::kTarget, std::nullopt, false);
  auto sum = runners_->checksum(Runner::kTarget);
  ASSERT_EQ(sum.rank_staged.size(), 2u);
  EXPECT_TRUE(sum.ranks_agree);
  EXPECT_EQ(sum.rank_staged[0], expected_combined(sent, Layout::kNone));
  EXPECT_EQ(sum.rank_staged[1], sum.rank_staged[0]);
}

TEST_F(RunnerSetTest, DiscardedStagingIgnoresLateWrites) {
  Staging staging(1);
  const RawTensor t = tensor("model.a", {32, 64}, 1);
  staging.stage(Runner::kTarget, 0, t.meta, t.bytes);
  staging.discard();
  staging.stage(Runner::kTarget, 0, t.meta, t.bytes);
  EXPECT_TRUE(staging.discarded());
  EXPECT_EQ(staging.tensor_count(Runner::kTarget), 0u);
  EXPECT_EQ(staging.staged_bytes(), 0u);
}

TEST(Safetensors, RoundTripsAndRefusesBadFiles) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("wc_engine_" + std::to_string(getpid()) + ".safetensors"))
                               .string();
  const std::vector<RawTensor> tensors = {tensor("model.a", {4, 8}, 0),
                                          tensor("model.b", {3}, 0, DType::kFloat32)};
  save_safetensors(path, tensors);
  auto back = load_safetensors(path, 1u << 20);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].meta, tensors[0].meta);
  EXPECT_EQ(back[0].bytes, tensors[0].bytes);
  EXPECT_EQ(back[1].meta, tensors[1].meta);
  EXPECT_EQ(back[1].bytes, tensors[1].bytes);
  EXPECT_THROW(load_safetensors(path, 16), comm::ConfigError) << "over the size limit";
  {
    // A header length far past the end of the file must be refused before any allocation.
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    const unsigned char huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    std::fwrite(huge, 1, 8, f);
    std::fclose(f);
  }
  EXPECT_THROW(load_safetensors(path, 1u << 20), comm::ConfigError);
  std::filesystem::remove(path);
  EXPECT_THROW(load_safetensors(path, 1u << 20), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync::engine
