// Receiver: one engine rank as a library, driven through fake channels (no sockets): staging
// until commit, digests checked before the first load, layer order, selector scope, failed loads
// put the previous version back, deltas against the kept base and against a wrong one.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>

#include "sync/engine/commit/receiver.h"
#include "sync/engine/commit/receiver_order.h"
#include "sync/model/delta.h"
#include "tests/sync/engine/fake_channel.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine {
namespace {

using testing::FakeSource;
using testing::pack_bucket;
using testing::tensor;

// The engine's side of the callbacks: what each runner holds, and the order loads came in.
struct Model {
  std::mutex mu;
  std::map<std::string, std::vector<std::byte>> weights[2];
  std::vector<std::string> order[2];
  int finishes[2] = {0, 0};
  std::string fail_on;  // a load of this name throws
  // A runner made with adopting[i] takes its staged tensors whole (ReceiverRunner::adopt).
  bool adopting[2] = {false, false};
  int adoptions[2] = {0, 0};
  std::map<std::string, StagedTensor> adopted[2];
  std::map<std::string, std::vector<std::int64_t>> shapes;  // what the target reports (shape_of)

  ReceiverRunner runner(Runner id, const char* filter) {
    const int i = static_cast<int>(id);
    ReceiverRunner r;
    r.id = id;
    r.filter = NameFilter::parse(filter);
    r.load = [this, i](std::span<const TensorView> views) {
      std::lock_guard lock(mu);
      for (const auto& v : views) {
        if (v.meta->name == fail_on) throw std::runtime_error("refusing " + fail_on);
        weights[i][v.meta->name].assign(v.bytes.begin(), v.bytes.end());
        order[i].push_back(v.meta->name);
      }
    };
    r.finish = [this, i] { finishes[i] += 1; };
    r.shape_of = [this](const std::string& name) -> std::optional<std::vector<std::int64_t>> {
      const auto it = shapes.find(name);
      if (it == shapes.end()) return std::nullopt;
      return it->second;
    };
    if (adopting[i]) {
      r.adopt = [this, i](std::map<std::string, StagedTensor>&& tensors) {
        std::lock_guard lock(mu);
        adoptions[i] += 1;
        for (auto& [name, t] : tensors) {
          weights[i][name].assign(t.bytes.span().begin(), t.bytes.span().end());
          adopted[i][name] = std::move(t);
        }
      };
    }
    return r;
  }
};

std::vector<RawTensor> target_round(std::uint64_t step) {
  return {tensor("model.layers.10.mlp.up_proj.weight", {8, 16}, step),
          tensor("model.layers.2.mlp.up_proj.weight", {8, 16}, step),
          tensor("lm_head.weight", {32, 16}, step),
          tensor("model.embed_tokens.weight", {32, 16}, step),
          tensor("draft.fc.weight", {16, 32}, step)};
}

UpdateWeightsFromDistributedRequest request_for(const std::vector<RawTensor>& tensors,
                                                Selector selector, std::uint64_t sequence) {
  UpdateWeightsFromDistributedRequest req;
  req.tensors = testing::metas_of(tensors);
  req.group_name = "g";
  req.selector = selector;
  req.sequence = sequence;
  return req;
}

class ReceiverTest : public ::testing::Test {
 protected:
  std::unique_ptr<Receiver> make(bool keep_base, ReceiverPlace place = {0, 1, -1},
                                 ExpertParallel experts = {}) {
    ReceiverOptions opts;
    opts.place = place;
    opts.experts = experts;
    opts.comm_timeout = comm::Millis(10000);
    opts.keep_delta_base = keep_base;
    opts.connector = [src = source_](const GroupSpec& spec, const ConnectOptions&, int) {
      return std::move(src->make_channels(1, spec.rank_offset).front());
    };
    std::vector<ReceiverRunner> runners{model_.runner(Runner::kTarget, "model.*,lm_head.weight"),
                                        model_.runner(Runner::kDraft, "draft.*")};
    auto r = std::make_unique<Receiver>(opts, std::move(runners));
    GroupSpec spec;
    spec.group_name = "g";
    spec.world_size = 1 + place.rank_count;
    r->join(spec);
    return r;
  }

  // One full round with `selector`: begin, one bucket, commit with version "v<step>".
  ReceiverCommit round(Receiver& r, std::uint64_t step, Selector selector) {
    const auto tensors = target_round(step);
    r.begin(selector);
    auto packed = pack_bucket(0, tensors);
    source_->broadcast(packed.bytes);
    r.receive(request_for(tensors, selector, 0));
    return r.commit("v" + std::to_string(step));
  }

  std::shared_ptr<FakeSource> source_ = std::make_shared<FakeSource>();
  Model model_;
};

TEST_F(ReceiverTest, LoadsNothingBeforeCommitThenEachLayerInOrder) {
  auto r = make(false);
  const auto tensors = target_round(1);
  r->begin(Selector::kTarget);
  source_->broadcast(pack_bucket(0, tensors).bytes);
  EXPECT_GT(r->receive(request_for(tensors, Selector::kTarget, 0)), 0u);
  EXPECT_TRUE(model_.order[0].empty()) << "a load ran before commit";
  const auto commit = r->commit("v1");
  EXPECT_EQ(commit.weight_version, "v1");
  EXPECT_EQ(r->weight_version(), "v1");
  EXPECT_EQ(model_.order[0], (std::vector<std::string>{
                                 "model.embed_tokens.weight", "model.layers.2.mlp.up_proj.weight",
                                 "model.layers.10.mlp.up_proj.weight", "lm_head.weight"}));
  // The selector scoped the draft out: never loaded, never post-processed.
  EXPECT_TRUE(model_.order[1].empty());
  EXPECT_EQ(model_.finishes[1], 0);
  EXPECT_EQ(model_.finishes[0], 1);
  for (const auto& t : tensors) {
    if (t.meta.name.rfind("draft.", 0) == 0) continue;
    EXPECT_EQ(model_.weights[0][t.meta.name], t.bytes) << t.meta.name;
  }
  EXPECT_EQ(r->delta_base_bytes(), 0u) << "no base is kept while deltas are off";
  EXPECT_TRUE(commit.runner_digest.empty());
}

// Engine rank 3 of 4 with ep_size 2 is EP rank 1 (SGLang: 3 / (4 / 2)): of 4 experts it holds 2
// and 3; the others' tensors are never staged nor loaded, the dense ones and the router are.
TEST_F(ReceiverTest, AnEpRankLoadsItsOwnExpertsAndDropsTheOthers) {
  auto r = make(false, {3, 4, -1}, {.ep_size = 2, .num_experts = 4});
  ASSERT_EQ(r->expert_placements().size(), 1u);
  EXPECT_EQ(r->expert_placements()[0].ep_rank(), 1);
  std::vector<RawTensor> tensors{tensor("model.embed_tokens.weight", {32, 16}, 1),
                                 tensor("model.layers.0.mlp.gate.weight", {4, 16}, 1)};
  for (int e = 0; e < 4; ++e) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      tensors.push_back(
          tensor("model.layers.0.mlp.experts." + std::to_string(e) + "." + proj + ".weight",
                 {8, 16}, static_cast<std::uint64_t>(e + 1)));
    }
  }
  r->begin(Selector::kTarget);
  source_->broadcast(pack_bucket(0, tensors).bytes);
  r->receive(request_for(tensors, Selector::kTarget, 0));
  r->commit("v1");
  EXPECT_EQ(r->experts_dropped(), 6u) << "experts 0 and 1, three matrices each";
  std::set<std::string> loaded(model_.order[0].begin(), model_.order[0].end());
  EXPECT_EQ(loaded.size(), 8u);
  for (const auto& t : tensors) {
    const bool other = t.meta.name.find("experts.0.") != std::string::npos ||
                       t.meta.name.find("experts.1.") != std::string::npos;
    EXPECT_EQ(loaded.count(t.meta.name), other ? 0u : 1u) << t.meta.name;
    if (!other) {
      EXPECT_EQ(model_.weights[0][t.meta.name], t.bytes) << t.meta.name;
    }
  }
  // An EP size that does not divide the engine's ranks is a configuration error.
  EXPECT_THROW(make(false, {0, 4, -1}, {.ep_size = 3, .num_experts = 6}), comm::ConfigError);
}

TEST_F(ReceiverTest, AFailingLoadNamesRunnerAndTensorAndPutsThePreviousVersionBack) {
  auto r = make(true);
  round(*r, 1, Selector::kAll);
  const auto before = model_.weights[0];
  EXPECT_GT(r->delta_base_bytes(), 0u);
  model_.fail_on = "model.layers.10.mlp.up_proj.weight";
  try {
    round(*r, 2, Selector::kAll);
    FAIL() << "the commit succeeded";
  } catch (const LoadError& e) {
    EXPECT_EQ(e.runner(), Runner::kTarget);
    EXPECT_EQ(e.tensor(), "model.layers.10.mlp.up_proj.weight");
    EXPECT_NE(std::string(e.what()).find("refusing"), std::string::npos) << e.what();
  }
  EXPECT_EQ(r->weight_version(), "v1");
  EXPECT_FALSE(r->in_session());
  // Layers 2 and the embedding had taken v2 bytes before layer 10 threw; they hold v1 again.
  EXPECT_EQ(model_.weights[0], before);
  // The receiver is usable again.
  model_.fail_on.clear();
  EXPECT_EQ(round(*r, 3, Selector::kAll).weight_version, "v3");
}

// A runner that keeps what it is handed (RunnerSet in weightcast-engine) takes its staged tensors
// whole, once, after the other runners loaded: the same bytes and every rank's digest, no copy.
TEST_F(ReceiverTest, AnAdoptingRunnerTakesItsStagedTensorsWholeAfterTheOthersLoaded) {
  model_.adopting[1] = true;
  auto r = make(true);
  const auto commit = round(*r, 1, Selector::kAll);
  EXPECT_EQ(model_.adoptions[1], 1);
  EXPECT_TRUE(model_.order[1].empty()) << "an adopting runner's load was called";
  EXPECT_EQ(model_.finishes[1], 0);
  ASSERT_EQ(model_.adopted[1].size(), 1u);
  const auto tensors = target_round(1);
  const RawTensor& draft = tensors.back();
  const StagedTensor& got = model_.adopted[1].at(draft.meta.name);
  EXPECT_EQ(got.meta, draft.meta);
  EXPECT_TRUE(std::equal(got.bytes.span().begin(), got.bytes.span().end(), draft.bytes.begin(),
                         draft.bytes.end()));
  ASSERT_EQ(got.rank_digests.size(), 1u);
  EXPECT_EQ(got.rank_digests[0], tensor_digest(std::span<const std::byte>(draft.bytes)));
  // The target loaded layer by layer as before; both runners are counted in the commit.
  EXPECT_EQ(model_.order[0].size(), 4u);
  EXPECT_EQ(commit.runners,
            (std::vector<RunnerUpdateStats>{{Runner::kTarget, 4, 0}, {Runner::kDraft, 1, 0}}));
  // The base recorded the adopted tensor too: the next round may send it as a delta.
  ASSERT_NE(r->delta_base_bytes(), 0u);
  EXPECT_EQ(round(*r, 2, Selector::kAll).weight_version, "v2");
  EXPECT_EQ(model_.adoptions[1], 2);
}

// When another runner's load fails, the commit fails before any adoption: the adopting runner is
// handed nothing, and the version stays.
TEST_F(ReceiverTest, AFailedLoadLeavesAnAdoptingRunnerUntouched) {
  model_.adopting[1] = true;
  auto r = make(true);
  round(*r, 1, Selector::kAll);
  const auto draft_before = model_.weights[1];
  model_.fail_on = "model.layers.10.mlp.up_proj.weight";
  EXPECT_THROW(round(*r, 2, Selector::kAll), LoadError);
  EXPECT_EQ(model_.adoptions[1], 1);
  EXPECT_EQ(model_.weights[1], draft_before);
  EXPECT_EQ(r->weight_version(), "v1");
  model_.fail_on.clear();
  EXPECT_EQ(round(*r, 3, Selector::kAll).weight_version, "v3");
  EXPECT_EQ(model_.adoptions[1], 2);
}

TEST_F(ReceiverTest, DeltaAppliesToTheKeptBaseAndAWrongBaseChangesNothing) {
  auto r = make(true);
  const auto commit = round(*r, 1, Selector::kAll);
  const std::size_t sent = total_bytes(testing::metas_of(target_round(1)));
  EXPECT_EQ(r->delta_base_bytes(), sent);
  const auto begun = r->begin(Selector::kAll);
  EXPECT_EQ(begun.runner_digest, commit.runner_digest) << "the trainer's delta precondition";
  const auto base = target_round(1), next = target_round(2);
  const auto base_bucket = pack_bucket(0, base), next_bucket = pack_bucket(0, next);
  DeltaEncoder encoder(DeltaCodec::kXorZstd);
  std::vector<std::byte> payload;
  ASSERT_TRUE(
      encoder.encode(next_bucket.bytes, base_bucket.bytes, next_bucket.bytes.size(), payload));
  auto req = request_for(next, Selector::kAll, 0);
  BucketDelta delta{DeltaCodec::kXorZstd, payload.size(), "v1", {}};
  for (const auto& t : base) delta.base_digests.push_back(to_string(tensor_digest(t.bytes)));
  req.delta = delta;
  source_->broadcast(payload);
  r->receive(req);
  r->commit("v2");
  for (const auto& t : next) {
    const int i = t.meta.name.rfind("draft.", 0) == 0 ? 1 : 0;
    EXPECT_EQ(model_.weights[i][t.meta.name], t.bytes) << t.meta.name;
  }
  // A delta against a version this receiver does not hold: refused, nothing changes.
  const auto held = model_.weights[0];
  r->begin(Selector::kAll);
  req.delta->base_version = "v0";
  try {
    r->receive(req);
    FAIL() << "a delta against the wrong base was accepted";
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 409) << e.what();
  }
  EXPECT_EQ(r->weight_version(), "v2");
  EXPECT_EQ(model_.weights[0], held);
  r->set_keep_delta_base(false);
  EXPECT_EQ(r->delta_base_bytes(), 0u);
}

TEST_F(ReceiverTest, RefusesOutOfSessionAndAbortDiscards) {
  auto r = make(false);
  const auto tensors = target_round(1);
  try {
    r->receive(request_for(tensors, Selector::kAll, 0));
    FAIL();
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 409);
  }
  r->begin(Selector::kTarget);
  EXPECT_THROW(r->begin(Selector::kTarget), ReceiverError);
  source_->broadcast(pack_bucket(0, tensors).bytes);
  r->receive(request_for(tensors, Selector::kTarget, 0));
  r->abort("test");
  EXPECT_THROW(r->commit(), ReceiverError);
  EXPECT_TRUE(model_.order[0].empty());
  EXPECT_EQ(r->weight_version(), "default");
}

TEST(ReceiverOrder, LayersSortNumericallyEmbeddingsFirstHeadLast) {
  const auto groups =
      load_groups({"model.norm.weight", "model.layers.10.a", "lm_head.weight", "model.layers.9.b",
                   "model.layers.9.a", "model.embed_tokens.weight"});
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0], std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_EQ(groups[1], (std::vector<std::string>{"model.layers.9.b", "model.layers.9.a"}));
  EXPECT_EQ(groups[2], std::vector<std::string>{"model.layers.10.a"});
  EXPECT_EQ(groups[3], (std::vector<std::string>{"model.norm.weight", "lm_head.weight"}));
}

// LoRA (docs/lora.md): an adapter session of up_proj (base [8, 16]) at rank `r`.
std::vector<RawTensor> adapter_tensors(std::uint64_t step, int r = 2) {
  const std::string m = "model.layers.2.mlp.up_proj";
  return {tensor(lora_tensor_name(m, LoraPart::kA), {r, 16}, step),
          tensor(lora_tensor_name(m, LoraPart::kB), {8, r}, step)};
}

AdapterTarget adapter_target(const std::string& name,
                             AdapterStore::Put put = AdapterStore::Put::kLoad) {
  return {name, parse_lora_config(R"({"r": 2, "lora_alpha": 4, "target_modules": ["up_proj"]})"),
          put};
}

class LoraReceiverTest : public ReceiverTest {
 protected:
  // Begin an adapter session, one bucket, commit; the commit's answer.
  ReceiverCommit adapter_round(Receiver& r, const std::vector<RawTensor>& tensors,
                               const AdapterTarget& target, const std::string& version) {
    r.begin(Selector::kTarget, std::nullopt, false, target);
    source_->broadcast(pack_bucket(0, tensors).bytes);
    r.receive(request_for(tensors, Selector::kTarget, 0));
    return r.commit(version);
  }
  void SetUp() override {
    for (const auto& t : target_round(0)) model_.shapes[t.meta.name] = t.meta.shape;
  }
};

TEST_F(LoraReceiverTest, AnAdapterSessionSwapsTheAdapterInAndLoadsNoRunner) {
  auto r = make(false);
  round(*r, 1, Selector::kTarget);
  const auto loads = model_.order[0].size();
  const auto base = model_.weights[0];
  const auto tensors = adapter_tensors(1);
  const auto commit = adapter_round(*r, tensors, adapter_target("math"), "a1");
  EXPECT_EQ(commit.adapter, "math");
  EXPECT_EQ(commit.weight_version, "v1");  // the base's version is not the adapter's
  EXPECT_EQ(r->weight_version(), "v1");
  EXPECT_EQ(model_.order[0].size(), loads) << "an adapter session loaded the target";
  EXPECT_EQ(model_.weights[0], base);
  EXPECT_EQ(model_.finishes[0], 1);
  EXPECT_EQ(model_.finishes[1], 0) << "an adapter session post-processed the draft";
  const auto held = r->adapters().find("math");
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->version, "a1");
  ASSERT_EQ(held->tensors.size(), 2u);
  for (const auto& t : tensors) {
    bool found = false;
    for (std::size_t i = 0; i < held->tensors.size(); ++i) {
      if (held->tensors[i].name != t.meta.name) continue;
      found = true;
      EXPECT_EQ(held->bytes[i], t.bytes) << t.meta.name;
      EXPECT_EQ(held->digests[i], tensor_digest(t.bytes)) << t.meta.name;
    }
    EXPECT_TRUE(found) << t.meta.name;
  }
}

TEST_F(LoraReceiverTest, RefusedAdapterUpdatesChangeNothing) {
  auto r = make(false);
  adapter_round(*r, adapter_tensors(1), adapter_target("math"), "a1");
  const auto before = r->adapters().find("math");
  for (Selector s : {Selector::kDraft, Selector::kAll}) {
    try {
      r->begin(s, std::nullopt, false, adapter_target("math"));
      FAIL() << "an adapter session of selector " << to_string(s) << " was opened";
    } catch (const ReceiverError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find("target model only"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(r->in_session());
  }
  // A base tensor in an adapter session: refused before anything is received.
  r->begin(Selector::kTarget, std::nullopt, false, adapter_target("math"));
  const auto base = target_round(2);
  try {
    r->receive(request_for({base[0]}, Selector::kTarget, 0));
    FAIL() << "a base tensor was taken in an adapter session";
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("is not a LoRA tensor"), std::string::npos) << e.what();
  }
  r->abort("refused");
  // A load that fails half-way (shapes of another rank: checked at commit) keeps the adapter.
  try {
    adapter_round(*r, adapter_tensors(2, /*r=*/3),
                  adapter_target("math", AdapterStore::Put::kUpsert), "a2");
    FAIL() << "an adapter of the wrong rank was swapped in";
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("expected [2, 16]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(r->adapters().find("math"), before);
  // A second load of a held name is a 409; an upsert replaces it.
  try {
    adapter_round(*r, adapter_tensors(3), adapter_target("math"), "a3");
    FAIL() << "a second load of 'math' was accepted";
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 409);
  }
  EXPECT_EQ(r->adapters().find("math"), before);
  adapter_round(*r, adapter_tensors(4), adapter_target("math", AdapterStore::Put::kUpsert), "a4");
  EXPECT_EQ(r->adapters().find("math")->version, "a4");
  EXPECT_EQ(before->version, "a1");  // a holder keeps what it took
  EXPECT_TRUE(r->unload_adapter("math"));
  EXPECT_EQ(r->adapters().find("math"), nullptr);
  EXPECT_TRUE(model_.order[0].empty()) << "an adapter session loaded the target";
}

// Shard-aware broadcast (docs/sharding.md): a class group lists the engine ranks that join it.
TEST_F(ReceiverTest, ARankOutsideAClassGroupAnswersItsBucketsWithoutReceiving) {
  auto r = make(false, {1, 2, -1});
  GroupSpec other;
  other.group_name = "class-of-rank-0";
  other.world_size = 3;
  other.ranks = {0};
  r->join(other);  // no channel is formed: the fake source would not answer one
  const auto tensors = target_round(1);
  r->begin(Selector::kTarget);
  auto request = request_for(tensors, Selector::kTarget, 0);
  request.group_name = other.group_name;
  EXPECT_EQ(r->receive(request), 0u);
  r->commit("v1");
  EXPECT_TRUE(model_.order[0].empty());
  EXPECT_FALSE(r->leave(other.group_name));
  EXPECT_THROW(r->leave(other.group_name), ReceiverError);  // left: the mark is gone
}

TEST_F(ReceiverTest, AListedRankJoinsAtItsIndexInTheList) {
  ReceiverOptions opts;
  opts.place = {2, 4, -1};
  std::vector<int> joined_at;
  opts.connector = [&](const GroupSpec& spec, const ConnectOptions&,
                       int engine_rank) -> std::unique_ptr<BucketChannel> {
    joined_at.push_back(spec.rank_offset + engine_rank);
    throw comm::PeerError("test", "stops after the group rank is known");
  };
  std::vector<ReceiverRunner> runners{model_.runner(Runner::kTarget, "*")};
  Receiver r(opts, std::move(runners));
  GroupSpec spec;
  spec.group_name = "class";
  spec.world_size = 3;
  spec.ranks = {0, 2};  // engine rank 2 is second: group rank 1 + 1
  EXPECT_THROW(r.join(spec), ReceiverError);
  EXPECT_EQ(joined_at, (std::vector<int>{2}));
  spec.world_size = 2;  // no room for two listed ranks
  try {
    r.join(spec);
    ADD_FAILURE() << "a group without room for its listed ranks was joined";
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("leaves no room for the 2 ranks listed"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace weightcast::sync::engine
