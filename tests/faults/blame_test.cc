// Blame only with evidence (docs/reliability.md, "Whom the elastic set drops"): with
// --on-engine-failure drop, an engine leaves the set only when something in the failure points at
// it. Here the fault is the trainer's own: the tensors' source throws at the third read of a tensor
// in the second update (injected through the bucket sender's await_tensor hook, which the packing
// pass, and the digests taken ahead of it, call for every tensor). Every engine still answers
// /health, and each one's bucket request fails once the trainer aborts the data plane, so a
// blame taken from those answers would drop one engine and retry. None may be dropped: the step
// fails, nothing commits anywhere, and the next update reaches every engine.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "tests/faults/fault_support.h"

namespace weightcast::faults {
namespace {

TEST(Blame, ATrainerSideFaultDropsNoEngineAndFailsTheStep) {
  std::vector<std::unique_ptr<EnginePeer>> engines;
  std::vector<std::string> urls;
  for (int i = 0; i < 2; ++i) {
    engines.push_back(std::make_unique<EnginePeer>(EngineConfig{}));
    urls.push_back(engines.back()->url());
  }
  TrainerConfig tc;
  auto options = updater_options(tc);
  options.on_engine_failure = sync::trainer::EngineFailurePolicy::kDrop;
  std::atomic<bool> armed{false};
  std::atomic<int> read{0};
  options.buckets.await_tensor = [&](const std::string& name, comm::Deadline) {
    if (armed.load() && ++read == 3) {
      throw std::runtime_error("injected: the tensors' source failed at '" + name + "'");
    }
  };
  sync::trainer::DistributedUpdater updater(urls, options);
  const auto first = updater.update(views_at(1));
  ASSERT_TRUE(first.ok) << sync::trainer::summary(first);

  armed = true;
  const auto failed = updater.update(views_at(2));
  EXPECT_FALSE(failed.ok);
  EXPECT_GE(read.load(), 3) << "the fault was never injected";
  EXPECT_TRUE(failed.trainer_fault) << sync::trainer::summary(failed);
  EXPECT_TRUE(failed.dropped.empty()) << sync::trainer::summary(failed);
  EXPECT_TRUE(failed.out.empty()) << sync::trainer::summary(failed);
  EXPECT_EQ(failed.failed_engine, "") << sync::trainer::summary(failed);
  EXPECT_NE(failed.error.find("injected: the tensors' source failed"), std::string::npos)
      << failed.error;
  for (const auto& url : urls) expect_engine_at(url, 1, "after the trainer's own fault");

  armed = false;
  const auto again = updater.update(views_at(2));
  ASSERT_TRUE(again.ok) << sync::trainer::summary(again);
  EXPECT_EQ(again.engines_current, urls.size());
  for (const auto& url : urls) expect_engine_at(url, 2, "after the next update");
}

}  // namespace
}  // namespace weightcast::faults
