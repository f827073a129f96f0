// weightcast-train's command line and the values derived from it, and the stage messages its
// sources exchange; no MPI or network needed.
#include "launcher/train/train_options.h"

#include <gtest/gtest.h>

#include "comm/errors.h"
#include "sync/trainer/stage_outcome.h"

namespace weightcast::launcher::train {
namespace {

using sync::trainer::parse_stage_outcome;
using sync::trainer::StageOutcome;
using sync::trainer::to_text;

TrainOptions parse(std::vector<std::string> args) {
  CLI::App app;
  TrainOptions o;
  add_options(app, o);
  args.insert(args.begin(), "weightcast-train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return o;
}

TEST(TrainOptions, ParsesTheIssueCommandLine) {
  const auto o = parse({"--tp", "2", "--pp", "2", "--engines", "http://a:1,http://b:2", "--steps",
                        "3", "--verify", "--selector", "all", "--bucket-bytes", "64K", "--backend",
                        "gloo", "--token", "t"});
  EXPECT_EQ(o.tp, 2);
  EXPECT_EQ(o.pp, 2);
  EXPECT_EQ(o.engines, (std::vector<std::string>{"http://a:1", "http://b:2"}));
  EXPECT_EQ(o.steps, 3);
  EXPECT_TRUE(o.verify);
  const auto u = updater_options(o, {});
  ASSERT_TRUE(u.selector.has_value());
  EXPECT_EQ(*u.selector, sync::Selector::kAll);
  EXPECT_EQ(u.buckets.bucket_bytes, 64u * 1024);
  EXPECT_EQ(u.token, "t");
  EXPECT_EQ(u.backend, sync::Backend::kGloo);
}

TEST(TrainOptions, RefusesBadValues) {
  EXPECT_THROW(parse({"--steps", "1"}), CLI::ParseError);  // --engines is required
  EXPECT_THROW(parse({"--engines", "x", "--selector", "both"}), CLI::ParseError);
  EXPECT_THROW(parse({"--engines", "x", "--conversion", "magic"}), CLI::ParseError);
  EXPECT_THROW(parse({"--engines", "x", "--backend", "mpi"}), CLI::ParseError);
  auto o = parse({"--engines", "x", "--bucket-bytes", "12Q"});
  EXPECT_THROW(updater_options(o, {}), std::invalid_argument);
}

TEST(TrainOptions, EngineFailurePolicyDefaultsToFailAndDropIsWiredToTheUpdater) {
  const auto d = updater_options(parse({"--engines", "x"}), {});
  EXPECT_EQ(d.on_engine_failure, sync::trainer::EngineFailurePolicy::kFail);
  const auto o = parse({"--engines", "x", "--on-engine-failure", "drop", "--probe-timeout-ms",
                        "500", "--probe-backoff-max-steps", "3", "--step-interval-ms", "100"});
  EXPECT_EQ(o.step_interval_ms, 100);
  const auto u = updater_options(o, {});
  EXPECT_EQ(u.on_engine_failure, sync::trainer::EngineFailurePolicy::kDrop);
  EXPECT_EQ(u.probe_timeout, comm::Millis(500));
  EXPECT_EQ(u.max_backoff_updates, 3);
  EXPECT_THROW(parse({"--engines", "x", "--on-engine-failure", "retry"}), CLI::ParseError);
}

TEST(TrainOptions, AutoSelectorIsLeftToTheDecisionFunction) {
  const auto o = parse({"--engines", "x"});
  EXPECT_FALSE(updater_options(o, {}).selector.has_value());
  const auto spec = resolve_model(o);
  const auto from_engines = selector_config(o, spec, std::string("EAGLE"));
  EXPECT_EQ(sync::weight_update_selector(from_engines), sync::Selector::kTarget);
  const auto bridge = parse({"--engines", "x", "--conversion", "bridge"});
  EXPECT_EQ(sync::weight_update_selector(selector_config(bridge, spec, std::string("EAGLE"))),
            sync::Selector::kAll);
  const auto mtp = parse({"--engines", "x", "--mtp-layers", "1"});
  EXPECT_EQ(sync::weight_update_selector(selector_config(mtp, resolve_model(mtp), "EAGLE")),
            sync::Selector::kAll);
  const auto flag = parse({"--engines", "x", "--speculative-algorithm", "NEXTN"});
  EXPECT_EQ(selector_config(flag, spec, std::nullopt).speculative_algorithm, "NEXTN");
  EXPECT_EQ(sync::weight_update_selector(selector_config(o, spec, std::nullopt)),
            sync::Selector::kAll);  // no speculative decoding anywhere
}

TEST(TrainOptions, ModelFromPresetWithOverrides) {
  const auto o =
      parse({"--engines", "x", "--model", "tiny", "--num-layers", "4", "--dtype", "float32"});
  const auto spec = resolve_model(o);
  EXPECT_EQ(spec.num_layers, 4);
  EXPECT_EQ(spec.dtype, sync::DType::kFloat32);
  EXPECT_EQ(spec.hidden_size, sync::model_preset("tiny").hidden_size);
  EXPECT_THROW(resolve_model(parse({"--engines", "x", "--model", "no-such-model"})),
               comm::ConfigError);
  EXPECT_THROW(resolve_model(parse({"--engines", "x", "--num-kv-heads", "3"})), comm::ConfigError);
}

TEST(StageMessages, RoundTrip) {
  StageOutcome o;
  o.sent = true;
  o.result.ok = false;
  o.result.tensors = 3;
  o.result.bytes = 1234;
  o.result.buckets = 2;
  o.result.seconds = 0.5;
  o.result.error = "bucket 1 on group g: reset";
  o.result.failures.push_back(
      {"http://b:2", "POST /update_weights_from_distributed", "gone", true, false});
  o.digests.push_back({"w", {sync::Digest{1, 2}, sync::Digest{3, 4}}});
  const auto back = parse_stage_outcome(to_text(o));
  EXPECT_EQ(back.sent, o.sent);
  EXPECT_EQ(back.result.bytes, 1234u);
  EXPECT_EQ(back.result.error, o.result.error);
  ASSERT_EQ(back.result.failures.size(), 1u);
  EXPECT_EQ(back.result.failures[0].engine, "http://b:2");
  EXPECT_TRUE(back.result.failures[0].unreachable);
  EXPECT_EQ(back.digests, o.digests);
  EXPECT_THROW(parse_stage_outcome("{}"), comm::BadRequestError);
}

}  // namespace
}  // namespace weightcast::launcher::train
