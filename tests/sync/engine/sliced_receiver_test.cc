// A Receiver serving several engine ranks with shard plans (weightcast-engine's --shard-plan,
// docs/sharding.md), driven through fake channels: each rank joins its own shard class's group
// and stages only its slices, commit puts the full tensors together (KV heads shared by ranks
// included), and what is not right is refused: a join of ranks that keep different slices, a
// slice of the wrong shape, a rank that received nothing, ranks sharing a slice that disagree.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "sync/engine/commit/receiver.h"
#include "sync/model/shard_plan.h"
#include "tests/sync/engine/fake_channel.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine {
namespace {

using testing::FakeSource;
using testing::pack_bucket;
using testing::tensor;

constexpr char kQ[] = "model.layers.0.self_attn.q_proj.weight";  // rows split over 4 ranks
constexpr char kK[] = "model.layers.0.self_attn.k_proj.weight";  // 2 heads: pairs share one
constexpr char kNorm[] = "model.norm.weight";                    // replicated

std::vector<RawTensor> full_round(std::uint64_t step) {
  return {tensor(kQ, {8, 4}, step), tensor(kK, {4, 4}, step), tensor(kNorm, {4}, step)};
}

ShardPlan plan_of_rank(int r) {
  ShardPlan p;
  p.tensors[kQ] = TensorSlice::slice(0, 2 * r, 2);
  p.tensors[kK] = TensorSlice::slice(0, 2 * (r / 2), 2);
  p.tensors[kNorm] = TensorSlice::replicated();
  return p;
}

// What rank `r` is sent: each tensor narrowed by its plan.
std::vector<RawTensor> slices_of(const std::vector<RawTensor>& full, int r) {
  const ShardPlan plan = plan_of_rank(r);
  std::vector<RawTensor> out;
  for (const RawTensor& t : full) {
    const TensorSlice& s = *plan.find(t.meta.name);
    RawTensor part{TensorMeta{t.meta.name, t.meta.dtype, sliced_shape(t.meta, s)}, {}};
    part.bytes.resize(sliced_bytes(t.meta, s));
    pack_slice(t.meta, s, t.bytes, part.bytes);
    out.push_back(std::move(part));
  }
  return out;
}

// `call` throws a ReceiverError with `status` whose message holds `text`.
template <typename Call>
void expect_refused(Call call, int status, const std::string& text, const char* what) {
  try {
    call();
    ADD_FAILURE() << what;
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

class SlicedReceiverTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 4;

  void SetUp() override {
    for (auto& s : sources_) s = std::make_shared<FakeSource>();
    ReceiverOptions opts;
    opts.place = {0, kRanks, -1, kRanks};
    opts.comm_timeout = comm::Millis(10000);
    for (int r = 0; r < kRanks; ++r) opts.shard_plans.push_back(plan_of_rank(r));
    // Group "c<r>" is rank r's shard class; each has its own source.
    opts.group_connector = [this](const GroupSpec& spec, const ConnectOptions& c) {
      return sources_[spec.group_name.back() - '0']->make_channels(c.rank_count, spec.rank_offset);
    };
    ReceiverRunner runner;
    runner.id = Runner::kTarget;
    runner.filter = NameFilter::parse("model.*");
    runner.load = [this](std::span<const TensorView> views) {
      std::lock_guard lock(mu_);
      for (const auto& v : views) weights_[v.meta->name].assign(v.bytes.begin(), v.bytes.end());
    };
    runner.shape_of = [](const std::string& name) -> std::optional<std::vector<std::int64_t>> {
      for (const RawTensor& t : full_round(0)) {
        if (t.meta.name == name) return t.meta.shape;
      }
      return std::nullopt;
    };
    runner.check = [](const TensorMeta& meta) -> std::optional<std::string> {
      for (const RawTensor& t : full_round(0)) {
        if (t.meta.name == meta.name && t.meta.shape != meta.shape) return "shape of " + meta.name;
      }
      return std::nullopt;
    };
    receiver_ = std::make_unique<Receiver>(opts, std::vector<ReceiverRunner>{runner});
    for (int r = 0; r < kRanks; ++r) receiver_->join(class_group(r));
  }

  static GroupSpec class_group(int r) {
    GroupSpec spec;
    spec.group_name = "c" + std::to_string(r);
    spec.world_size = 2;
    spec.ranks = {r};
    return spec;
  }

  // Sends rank r's bucket (`tensors`) on its class group; returns the bytes staged.
  std::size_t send(int r, const std::vector<RawTensor>& tensors) {
    sources_[static_cast<std::size_t>(r)]->broadcast(pack_bucket(0, tensors).bytes);
    UpdateWeightsFromDistributedRequest req;
    req.tensors = testing::metas_of(tensors);
    req.group_name = "c" + std::to_string(r);
    req.sequence = 0;
    return receiver_->receive(req);
  }

  std::shared_ptr<FakeSource> sources_[kRanks];
  std::unique_ptr<Receiver> receiver_;
  std::mutex mu_;
  std::map<std::string, std::vector<std::byte>> weights_;
};

TEST_F(SlicedReceiverTest, EachRankStagesItsSlicesAndCommitPutsTheTensorsTogether) {
  for (std::uint64_t step = 1; step <= 2; ++step) {
    const auto full = full_round(step);
    weights_.clear();
    receiver_->begin(Selector::kTarget);
    for (int r = 0; r < kRanks; ++r) EXPECT_GT(send(r, slices_of(full, r)), 0u);
    EXPECT_TRUE(weights_.empty()) << "loaded before commit";
    receiver_->commit("v" + std::to_string(step));
    EXPECT_EQ(receiver_->weight_version(), "v" + std::to_string(step));
    for (const RawTensor& t : full) EXPECT_EQ(weights_[t.meta.name], t.bytes) << t.meta.name;
    const auto digests = receiver_->digests(Runner::kTarget);
    EXPECT_EQ(digests.at(kQ), tensor_digest(full[0].bytes));
  }
}

TEST_F(SlicedReceiverTest, WholeTensorsOnEveryClassGroupAreTakenAsTheyAre) {
  // A tensor no plan slices, or a trainer that sends whole tensors on every class group.
  const auto full = full_round(3);
  receiver_->begin(Selector::kTarget);
  for (int r = 0; r < kRanks; ++r) send(r, full);
  receiver_->commit("v3");
  for (const RawTensor& t : full) EXPECT_EQ(weights_[t.meta.name], t.bytes) << t.meta.name;
}

TEST_F(SlicedReceiverTest, ARankThatReceivedNothingFailsTheCommit) {
  const auto full = full_round(1);
  receiver_->begin(Selector::kTarget);
  for (int r = 0; r < kRanks - 1; ++r) send(r, slices_of(full, r));
  expect_refused([&] { receiver_->commit("v1"); }, 500,
                 std::string("engine rank 3: runner 'target': tensor '") + kK +
                     "' was not received by this rank",
                 "committed without rank 3's slices");
  EXPECT_EQ(receiver_->weight_version(), "default");
  EXPECT_TRUE(weights_.empty());
}

TEST_F(SlicedReceiverTest, RanksSharingASliceThatDisagreeFailTheCommit) {
  const auto full = full_round(1);
  receiver_->begin(Selector::kTarget);
  for (int r = 0; r < kRanks; ++r) {
    auto mine = slices_of(full, r);
    if (r == 1) mine[1].bytes[0] ^= std::byte{1};  // rank 1's copy of the head it shares with 0
    send(r, mine);
  }
  expect_refused([&] { receiver_->commit("v1"); }, 500,
                 std::string(kK) + "' differs from another rank's copy of the same slice",
                 "committed ranks that disagree on a shared KV head");
  EXPECT_TRUE(weights_.empty());
}

TEST_F(SlicedReceiverTest, ABucketThatArrivesWrongNamesTheEngineRankOfItsGroup) {
  // Rank 2 alone in its class group: the group's first channel stages as engine rank 2, and the
  // message says so (not "engine rank 0", its index in the group).
  const auto full = full_round(1);
  receiver_->begin(Selector::kTarget);
  auto mine = slices_of(full, 2);
  sources_[2]->broadcast(pack_bucket(0, mine).bytes);
  UpdateWeightsFromDistributedRequest req;
  req.tensors = testing::metas_of(mine);
  req.group_name = "c2";
  for (const RawTensor& t : mine) req.digests.push_back(to_string(tensor_digest(t.bytes)));
  req.digests[0] = to_string(tensor_digest(mine[1].bytes));  // the trainer sent other bytes
  expect_refused([&] { receiver_->receive(req); }, 500,
                 std::string("engine rank 2, bucket 0: tensor '") + kQ + "' holds digest",
                 "a bucket whose digest differs was staged");
}

TEST_F(SlicedReceiverTest, ASliceOfAnotherShapeIsRefusedAtReceive) {
  const auto full = full_round(1);
  receiver_->begin(Selector::kTarget);
  auto wrong = slices_of(full, 0);
  wrong[0] = slices_of(full_round(1), 0)[1];  // k's 2 rows where q's 2 rows belong: same shape
  wrong[0].meta.name = kQ;
  wrong[0].meta.shape = {4, 4};  // neither the full [8, 4] nor the plan's [2, 4]
  wrong[0].bytes.resize(32);
  UpdateWeightsFromDistributedRequest req;
  req.tensors = testing::metas_of(wrong);
  req.group_name = "c0";
  expect_refused([&] { receiver_->receive(req); }, 400, "dim 0 [0, 2)",
                 "a slice of the wrong shape was taken");
}

TEST_F(SlicedReceiverTest, OnlyConsecutiveRanksOfOneClassJoinOneGroup) {
  GroupSpec spec = class_group(0);
  spec.group_name = "c0";
  spec.world_size = 3;
  spec.ranks = {0, 1};  // different q slices: not one class
  expect_refused([&] { receiver_->join(spec); }, 400, "keep different slices",
                 "ranks of two classes joined one group");
  spec.ranks = {0, 2};
  expect_refused([&] { receiver_->join(spec); }, 400, "as consecutive ranks",
                 "ranks 0 and 2 joined one group");
}

}  // namespace
}  // namespace weightcast::sync::engine
