// Delta updates end to end (sync/trainer/delta_source.h, sync/engine/runners/delta_base.h), with
// real engine processes and drifted weights (sync/model/drift.h): once every engine confirmed a
// version, buckets travel as deltas a fraction of their size; an engine that restarted makes the
// next update full, the one after is delta again; an engine whose weights were changed behind the
// trainer's back (same version text, other bytes) answers begin with another runner digest, so
// the next update is full and the one after is delta again. Every engine ends bit-identical to the
// trainer's bytes. (The engine's own refusal of a delta against bytes it does not hold, 409 naming
// both digests, is tested in tests/sync/engine/http_delta_test.cc, below the trainer's check.)
#include <gtest/gtest.h>

#include <csignal>

#include "sync/model/checksum.h"
#include "sync/model/drift.h"
#include "sync/model/layout.h"
#include "tests/faults/fault_support.h"
#include "tests/support/engine_http.h"
#include "tests/support/engine_launch.h"

namespace weightcast::faults {
namespace {

// The target tensors of "tiny" drifting from version 0 as a trainer's fp32 masters would.
class DriftingWeights {
 public:
  DriftingWeights() {
    for (const auto& t : weights_at(0)) {
      tensors_.push_back(t);
      drifts_.emplace_back(t.meta.dtype, t.bytes, kSeed, sync::kRealisticLr);
    }
  }
  // Moves to `step` and returns the fraction of elements that changed.
  double step(std::uint64_t step) {
    std::size_t changed = 0;
    std::size_t total = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      changed += drifts_[i].step(step, tensors_[i].bytes);
      total += drifts_[i].elements();
    }
    return static_cast<double>(changed) / static_cast<double>(total);
  }
  std::vector<sync::trainer::NamedTensor> views() const { return sync::trainer::views(tensors_); }
  // What /weights_checksum?runner=target must answer: the combined digest of the shuffled bytes.
  std::string target_digest() const { return shuffled_digest(views()); }

 private:
  std::vector<sync::trainer::HostTensor> tensors_;
  std::vector<sync::Drift> drifts_;
};

// weightcast_engine_pool_allocations_total of the engine at `url` (-1 when missing).
double pool_allocations(const std::string& url) {
  const std::string text = testing::EngineHttp(url).metrics();
  const std::string name = "weightcast_engine_pool_allocations_total ";
  const auto at = text.find("\n" + name);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + 1 + name.size()));
}

void expect_holds(const std::string& url, const DriftingWeights& w, const std::string& version) {
  const EngineState s = engine_state(url);
  EXPECT_EQ(s.version, version) << url;
  EXPECT_EQ(s.target_digest, w.target_digest()) << url << " target is bit-identical";
  EXPECT_EQ(s.draft_digest, draft_digest()) << url << " frozen draft untouched";
}

// One update that must succeed; returns its report.
sync::trainer::UpdateReport must_update(sync::trainer::DistributedUpdater& updater,
                                        const DriftingWeights& w, const std::string& version) {
  const auto views = w.views();
  auto report = updater.update(views, version);
  EXPECT_TRUE(report.ok) << "version " << version << ": " << report.error;
  return report;
}

TEST(DeltaUpdate, RestartedEngineMakesTheNextUpdateFullThenDeltasResumeBitIdentical) {
  EnginePeer a(EngineConfig{});
  auto b = std::make_unique<EnginePeer>(EngineConfig{});
  const int b_port = b->port();
  // kOn: on loopback the link outruns the encoder, so kAuto would (rightly) send in full.
  auto options = updater_options(TrainerConfig{});
  options.delta = sync::trainer::DeltaMode::kOn;
  auto updater = std::make_unique<sync::trainer::DistributedUpdater>(
      std::vector<std::string>{a.url(), b->url()}, options);
  DriftingWeights w;

  w.step(1);
  auto r = must_update(*updater, w, "1");
  EXPECT_EQ(r.delta_buckets, 0u) << "no engine holds a version this trainer sent";
  EXPECT_GE(r.wire_bytes, r.bytes);
  const double fraction = w.step(2);
  r = must_update(*updater, w, "2");
  EXPECT_EQ(r.delta_buckets, r.buckets) << "every engine confirmed version 1";
  EXPECT_LT(r.wire_bytes * 4, r.bytes) << "changed fraction " << fraction;
  figure("delta update of tiny: " + std::to_string(r.bytes) + " tensor bytes, " +
         std::to_string(r.wire_bytes) + " on the wire, " + std::to_string(100 * fraction) +
         "% of elements changed");
  expect_holds(a.url(), w, "2");
  expect_holds(b->url(), w, "2");

  // Engine b restarts (same port, so the trainer's URL still reaches it) with version 0.
  b->signal(SIGKILL);
  b.reset();
  auto argv = testing::test_engine_argv(
      WEIGHTCAST_ENGINE_BIN, 1, kSeed,
      {"--comm-timeout-ms", "3000", "--session-timeout-ms", "3000", "--init-timeout-ms", "3000"});
  argv[2] = std::to_string(b_port);  // "--port" "0" -> the old port
  testing::Subprocess restarted(argv);
  const std::string b_url = testing::wait_for_engine_url(restarted, std::chrono::seconds(30));

  w.step(3);
  // The group that held the old b fails once; the trainer re-forms it on the next attempt.
  auto views = w.views();
  r = updater->update(views, "3");
  if (!r.ok) r = updater->update(views, "3");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.delta_buckets, 0u) << "the restarted engine holds no version of this trainer";
  expect_holds(a.url(), w, "3");
  expect_holds(b_url, w, "3");

  const double pooled = pool_allocations(a.url());
  EXPECT_GT(pooled, 0) << "/metrics reports the receive pool";
  w.step(4);
  r = must_update(*updater, w, "4");
  EXPECT_EQ(r.delta_buckets, r.buckets) << "both engines confirmed version 3";
  EXPECT_EQ(pool_allocations(a.url()), pooled) << "a delta update reuses the pooled blocks";
  expect_holds(a.url(), w, "4");
  expect_holds(b_url, w, "4");
}

TEST(DeltaUpdate, EngineWrittenBehindTheTrainersBackGetsFullBucketsThenDeltasResume) {
  EnginePeer a(EngineConfig{});
  auto options = updater_options(TrainerConfig{});
  options.delta = sync::trainer::DeltaMode::kOn;
  auto updater = std::make_unique<sync::trainer::DistributedUpdater>(
      std::vector<std::string>{a.url()}, options);
  DriftingWeights w;
  w.step(1);
  must_update(*updater, w, "1");

  // Another trainer commits other bytes under the same version text behind our back. Our lease
  // would refuse it: an operator breaks the lease first (the only way in while we live).
  ASSERT_EQ(http_post(a.url(), "/release_weight_update_lease", R"({"force":true})").status, 200);
  auto other_options = updater_options(TrainerConfig{});
  other_options.group_prefix = "other";
  other_options.delta = sync::trainer::DeltaMode::kOff;
  {
    sync::trainer::DistributedUpdater other({a.url()}, other_options);
    const auto v5 = views_at(5);
    const auto report = other.update(v5, "1");
    ASSERT_TRUE(report.ok) << report.error;
  }
  EXPECT_EQ(engine_state(a.url()).target_digest, target_digest_at(5));

  w.step(2);
  auto r = must_update(*updater, w, "2");
  EXPECT_EQ(r.delta_buckets, 0u) << "begin answered another runner digest than the commit did";
  expect_holds(a.url(), w, "2");
  w.step(3);
  r = must_update(*updater, w, "3");
  EXPECT_EQ(r.delta_buckets, r.buckets) << "the engine holds version 2 as committed";
  expect_holds(a.url(), w, "3");
}

}  // namespace
}  // namespace weightcast::faults
