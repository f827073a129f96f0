// DistributedUpdater::update_lora against in-process fake engines (docs/lora.md): an adapter
// update opens a session of selector target carrying the adapter, never pauses generation, sends
// deltas against the adapter every engine confirms holding (else whole buckets), commits the
// adapter's own version and leaves the base weights and their version as they were; engines that
// take no adapters, and tensors that are no adapter, are refused before any session opens. The
// session token carries the adapter to other stage sources.
#include <gtest/gtest.h>

#include "comm/errors.h"
#include "sync/trainer/updater.h"
#include "tests/sync/trainer/fakes.h"
#include "tests/sync/trainer/test_tensors.h"

namespace weightcast::sync::trainer {
namespace {

using testing::FakeEngine;
using testing::kA;
using testing::kB;

LoraConfig config() {
  return parse_lora_config(R"({"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]})");
}

// The A and B of model.layers.<i>.self_attn.q_proj for layers 0 .. layers-1, random bytes.
std::vector<HostTensor> adapter(std::uint32_t seed, int layers) {
  std::vector<HostTensor> out = testing::random_tensors(seed, 2 * layers, 64);
  for (int i = 0; i < 2 * layers; ++i) {
    auto& t = out[static_cast<std::size_t>(i)];
    t.meta.name = lora_tensor_name("model.layers." + std::to_string(i / 2) + ".self_attn.q_proj",
                                   i % 2 ? LoraPart::kB : LoraPart::kA);
  }
  return out;
}

struct Fleet : testing::FakeFleet {
  explicit Fleet(Selector selector = Selector::kAll) : FakeFleet({1, 2}, options(selector)) {
    for (FakeEngine* e : engines) e->set_lora(true);
  }
  static UpdaterOptions options(Selector selector) {
    UpdaterOptions o;
    o.selector = selector;
    o.delta = DeltaMode::kOn;
    return o;
  }
};

TEST(LoraUpdater, SwapsTheAdapterInAndLeavesTheBase) {
  // An updater whose base updates cover target and draft: its adapter sessions are target only.
  Fleet f(Selector::kAll);
  const auto base = testing::random_tensors(3, 6, 300);
  ASSERT_TRUE(f.updater->update(views(base)).ok);
  const std::size_t pauses = f.wire.events.size();
  for (int step = 1; step <= 2; ++step) {
    const auto tensors = adapter(static_cast<std::uint32_t>(step), 3);
    const auto report = f.updater->update_lora("math", views(tensors), config());
    ASSERT_TRUE(report.ok) << report.error;
    EXPECT_EQ(report.adapter, "math");
    EXPECT_EQ(report.version, std::to_string(step));  // the adapter's own, counted per name
    EXPECT_EQ(report.selector, Selector::kTarget);
    EXPECT_EQ(report.delta_buckets, 0u);
    for (FakeEngine* e : f.engines) {
      EXPECT_EQ(e->adapter("math"), testing::as_map(tensors)) << e->url();
      EXPECT_EQ(e->adapter_version("math"), std::to_string(step));
      EXPECT_EQ(e->committed(), testing::as_map(base));  // the base as it was
      EXPECT_EQ(e->version(), "1");
      ASSERT_TRUE(e->last_lora());
      EXPECT_EQ(e->last_lora()->name, "math");
      EXPECT_TRUE(e->last_lora()->upsert);
      EXPECT_EQ(parse_lora_config(e->last_lora()->config_json).r, 2);
    }
    for (const auto& req : f.engines[1]->bucket_requests()) {
      if (req.tensors.front().name.find("lora_") == std::string::npos) continue;
      EXPECT_EQ(req.selector, Selector::kTarget);
      // No engine of this fleet answers a lora_digest, so none is a delta base.
      EXPECT_FALSE(req.delta) << "an adapter bucket travelled as a delta";
    }
  }
  // Generation was never paused, flushed or resumed for the adapters.
  std::lock_guard lock(f.wire.mu);
  for (std::size_t i = pauses; i < f.wire.events.size(); ++i) {
    const std::string& event = f.wire.events[i];
    EXPECT_EQ(event.find("pause_generation"), std::string::npos) << event;
    EXPECT_EQ(event.find("flush_cache"), std::string::npos) << event;
    EXPECT_EQ(event.find("continue_generation"), std::string::npos) << event;
  }
}

TEST(LoraUpdater, AnAdapterKeepsTheBaseWeightsDeltaBase) {
  Fleet f(Selector::kTarget);
  for (FakeEngine* e : f.engines) e->set_runner_digests(true);
  const auto base = testing::random_tensors(3, 6, 300);
  ASSERT_TRUE(f.updater->update(views(base)).ok);
  const auto tensors = adapter(1, 2);
  ASSERT_TRUE(f.updater->update_lora("math", views(tensors), config()).ok);
  // The next base session may still send deltas against version 1, which every engine holds:
  // the adapter changed neither the base weights nor their version.
  UpdateReport report;
  const auto session = f.updater->open_session(report);
  ASSERT_TRUE(session) << report.error;
  EXPECT_EQ(session->delta_base(), std::optional<std::string>("1"));
  EXPECT_EQ(session->version(), "2");
  EXPECT_FALSE(session->adapter());
  f.updater->abort(report, "test done");
}

TEST(LoraUpdater, AnAdapterIsTheDeltaBaseOfItsNextUpdate) {
  Fleet f(Selector::kTarget);
  for (FakeEngine* e : f.engines) e->set_runner_digests(true);
  const auto tensors = adapter(1, 2);
  ASSERT_TRUE(f.updater->update_lora("math", views(tensors), config()).ok);
  const auto open = [&](const std::string& name) {
    UpdateReport report;
    auto session =
        f.updater->open_session(report, {}, LoraBegin{name, to_json_string(config()), true});
    EXPECT_TRUE(session) << report.error;
    return std::pair{std::move(session), std::move(report)};
  };
  {
    // Every engine answers the adapter's version 1 with the digest its commit answered.
    auto [session, report] = open("math");
    ASSERT_TRUE(session);
    EXPECT_EQ(session->delta_base(), std::optional<std::string>("1"));
    EXPECT_EQ(session->version(), "2");
    EXPECT_EQ(*session->adapter(), "math");
    // The stage sources of other processes learn both from the token.
    const UpdateSession joined = join_session(session->token());
    EXPECT_EQ(joined.delta_base(), std::optional<std::string>("1"));
    EXPECT_EQ(joined.adapter(), std::optional<std::string>("math"));
    f.updater->abort(report, "test done");
  }
  {
    // The aborted session may have left anything: no base until the next commit everywhere.
    auto [session, report] = open("math");
    ASSERT_TRUE(session);
    EXPECT_FALSE(session->delta_base());
    f.updater->abort(report, "test done");
  }
  ASSERT_TRUE(f.updater->update_lora("math", views(tensors), config(), true, "3").ok);
  {
    // Another adapter's name has no base, and its session leaves math's base alone.
    auto [other, report] = open("code");
    ASSERT_TRUE(other);
    EXPECT_FALSE(other->delta_base());
    f.updater->abort(report, "test done");
    auto [again, again_report] = open("math");
    ASSERT_TRUE(again);
    EXPECT_EQ(again->delta_base(), std::optional<std::string>("3"));
    f.updater->abort(again_report, "test done");
  }
  ASSERT_TRUE(f.updater->update_lora("math", views(tensors), config(), true, "5").ok);
  {
    // An engine that lost the adapter (unloaded behind the trainer's back): full buckets.
    f.engines[1]->drop_adapter("math");
    auto [session, report] = open("math");
    ASSERT_TRUE(session);
    EXPECT_FALSE(session->delta_base());
    f.updater->abort(report, "test done");
  }
}

TEST(LoraUpdater, EnginesWithoutAdaptersAreRefusedBeforeAnySession) {
  Fleet f;
  f.engines[1]->set_lora(false);
  const auto tensors = adapter(1, 1);
  const std::string refusal = [&] {
    try {
      f.updater->update_lora("math", views(tensors), config());
    } catch (const comm::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  }();
  // It names the engine and what it lacks.
  EXPECT_NE(refusal.find(kB), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("lora_adapters"), std::string::npos) << refusal;
  EXPECT_EQ(f.wire.index_of(std::string(kA) + " POST /begin_weight_update"), -1);
}

TEST(LoraUpdater, TensorsThatAreNoAdapterAreRefusedBeforeAnyCall) {
  Fleet f;
  auto tensors = adapter(1, 1);
  tensors[0].meta.name = "model.layers.0.self_attn.q_proj.weight";  // a base weight
  EXPECT_THROW(f.updater->update_lora("math", views(tensors), config()), comm::BadRequestError);
  tensors = adapter(1, 1);
  EXPECT_THROW(f.updater->update_lora("bad name", views(tensors), config()), comm::BadRequestError);
  EXPECT_EQ(f.wire.index_of(std::string(kA) + " GET /server_info"), -1);
}

TEST(LoraUpdater, SessionTokenCarriesTheAdapter) {
  const UpdateSession joined = join_session("target 4 abc,- lora=math");
  ASSERT_TRUE(joined.adapter());
  EXPECT_EQ(*joined.adapter(), "math");
  EXPECT_EQ(joined.version(), "4");
  EXPECT_FALSE(joined.delta_base());
  EXPECT_EQ(joined.token(), "target 4 abc,- lora=math");
  // An adapter session with a delta base: the adapter's version every member holds.
  const UpdateSession based = join_session("target 5 abc,- base=4 lora=math");
  EXPECT_EQ(based.delta_base(), std::optional<std::string>("4"));
  EXPECT_EQ(based.adapter(), std::optional<std::string>("math"));
  EXPECT_EQ(based.token(), "target 5 abc,- base=4 lora=math");
  EXPECT_FALSE(join_session("target 4 abc,-").adapter());
  EXPECT_THROW(join_session("target 4 abc lora=bad/name"), comm::BadRequestError);
}

}  // namespace
}  // namespace weightcast::sync::trainer
