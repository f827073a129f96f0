// weightcast-engine as real processes, driven over HTTP and Gloo by the minimal sender in
// process_sender.h: the double-shuffle bug (reproduced with --legacy-finalize and selector all,
// prevented by selector target and by the per-tensor finalize), engines of different rank counts
// in one group, and a sender that dies mid-session.
#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "sync/engine/runners/weights.h"
#include "sync/model/model.h"
#include "tests/support/engine_http.h"
#include "tests/support/engine_launch.h"
#include "tests/support/subprocess.h"
#include "tests/sync/engine/process_sender.h"
#include "tests/sync/engine/test_util.h"

#ifndef WEIGHTCAST_ENGINE_BIN
#error "WEIGHTCAST_ENGINE_BIN must name the weightcast-engine executable"
#endif

namespace weightcast::sync::engine::testing {
namespace {

using namespace std::chrono_literals;
using weightcast::testing::Subprocess;

constexpr std::uint64_t kSeed = 5;
constexpr std::size_t kBucketBytes = 256 << 10;  // several buckets per update of "tiny"
const std::string kGroup = "weightcast-pp_0";

// Starts weightcast-engine with a target (shuffle) and a frozen draft (shuffle, a filter that
// matches none of the sent names).
EngineProcess start_engine(int ranks, std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--init-timeout-ms", "15000", "--comm-timeout-ms", "2000",
                                    "--chunk-bytes",     "64K"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return start_engine_process(WEIGHTCAST_ENGINE_BIN, ranks, kSeed, flags);
}

std::vector<RawTensor> sent_at(std::uint64_t step) {
  return generate_weights(target_tensors(model_preset("tiny")), kSeed, step);
}

std::string digest(Sender& s, std::size_t engine, const char* runner) {
  auto r = s.get(engine, std::string("/weights_checksum?runner=") + runner);
  EXPECT_EQ(r.status, 200) << r.body.dump();
  return r.body.value("digest", "");
}

std::map<std::string, std::string> tensor_digests(Sender& s, std::size_t engine,
                                                  const char* runner) {
  auto r = s.get(engine, std::string("/weights_checksum?runner=") + runner);
  std::map<std::string, std::string> out;
  for (const auto& t : r.body.value("tensors", nlohmann::json::array())) {
    out[t.at("name").get<std::string>()] = t.at("digest").get<std::string>();
  }
  return out;
}

void expect_all_200(const std::vector<HttpResult>& results, const char* what) {
  ASSERT_FALSE(results.empty()) << what;
  for (const auto& r : results) EXPECT_EQ(r.status, 200) << what << ": " << r.body.dump();
}

TEST(EngineProcess, LegacyFinalizeWithSelectorAllReshufflesTheFrozenDraft) {
  auto engine = start_engine(1, {"--legacy-finalize"});
  Sender sender({engine.endpoint}, kGroup, 10s);
  expect_all_200(sender.init(), "init");
  const std::string draft_before = digest(sender, 0, "draft");
  expect_all_200(sender.update(Selector::kAll, sent_at(1), kBucketBytes, "1"), "update");
  EXPECT_NE(digest(sender, 0, "draft"), draft_before) << "the bug, reproduced";
  auto info = sender.get(0, "/server_info");
  EXPECT_EQ(info.body["legacy_finalize"], true);
  EXPECT_EQ(info.body["weight_version"], "1");
}

TEST(EngineProcess, SelectorTargetKeepsTheDraftBitIdenticalEvenWithLegacyFinalize) {
  auto engine = start_engine(1, {"--legacy-finalize"});
  Sender sender({engine.endpoint}, kGroup, 10s);
  expect_all_200(sender.init(), "init");
  const std::string draft_before = digest(sender, 0, "draft");
  for (std::uint64_t step = 1; step <= 10; ++step) {
    SCOPED_TRACE("update " + std::to_string(step));
    expect_all_200(
        sender.update(Selector::kTarget, sent_at(step), kBucketBytes, std::to_string(step)),
        "update");
    EXPECT_EQ(digest(sender, 0, "draft"), draft_before);
  }
  EXPECT_EQ(tensor_digests(sender, 0, "target"), expected_digests(sent_at(10), Layout::kShuffle))
      << "target holds shuffle(sent)";
}

TEST(EngineProcess, SafeFinalizeWithSelectorAllKeepsTheDraftBitIdentical) {
  auto engine = start_engine(1);
  Sender sender({engine.endpoint}, kGroup, 10s);
  expect_all_200(sender.init(), "init");
  const std::string draft_before = digest(sender, 0, "draft");
  for (std::uint64_t step = 1; step <= 3; ++step) {
    expect_all_200(sender.update(Selector::kAll, sent_at(step), kBucketBytes, std::to_string(step)),
                   "update");
    EXPECT_EQ(digest(sender, 0, "draft"), draft_before);
  }
  EXPECT_EQ(tensor_digests(sender, 0, "target"), expected_digests(sent_at(3), Layout::kShuffle));
}

TEST(EngineProcess, EnginesOfDifferentRankCountsShareOneGroup) {
  auto one = start_engine(1);
  auto two = start_engine(2);
  Sender sender({one.endpoint, two.endpoint}, kGroup, 10s);
  EXPECT_EQ(sender.rank_offset(0), 1);
  EXPECT_EQ(sender.rank_offset(1), 2);
  EXPECT_EQ(sender.world_size(), 4);
  expect_all_200(sender.init(), "init");
  const auto sent = sent_at(4);
  expect_all_200(sender.update(Selector::kTarget, sent, kBucketBytes, "4"), "update");
  const auto expected = expected_digests(sent, Layout::kShuffle);
  std::vector<NamedDigest> raw;
  for (const auto& t : sent) raw.push_back({t.meta.name, tensor_digest(t.bytes)});
  const std::string raw_combined = to_string(combined_digest(raw));
  for (std::size_t e = 0; e < 2; ++e) {
    SCOPED_TRACE("engine " + std::to_string(e));
    auto info = sender.get(e, "/server_info");
    ASSERT_EQ(info.body["groups"].size(), 1u);
    EXPECT_EQ(info.body["groups"][0]["rank_offset"], sender.rank_offset(e));
    EXPECT_EQ(info.body["groups"][0]["world_size"], 4);
    EXPECT_EQ(info.body["groups"][0]["ranks"], static_cast<int>(e + 1));
    EXPECT_EQ(tensor_digests(sender, e, "target"), expected);
    auto sum = sender.get(e, "/weights_checksum?runner=target");
    // Every engine rank staged exactly the sent bytes (commit also refuses disagreement).
    ASSERT_EQ(sum.body["rank_staged_digests"].size(), e + 1);
    for (const auto& d : sum.body["rank_staged_digests"]) EXPECT_EQ(d, raw_combined);
    EXPECT_EQ(sum.body["ranks_agree"], true);
  }
}

TEST(EngineProcess, SenderStoppingMidSessionLeavesWeightsAndRecovers) {
  auto engine = start_engine(2);
  Sender sender({engine.endpoint}, kGroup, 10s);
  expect_all_200(sender.init(), "init");
  expect_all_200(sender.update(Selector::kTarget, sent_at(1), kBucketBytes, "1"), "first update");
  const std::string target_before = digest(sender, 0, "target");
  const std::string draft_before = digest(sender, 0, "draft");
  const std::size_t buckets = plan_buckets(metas_of(sent_at(2)), kBucketBytes).size();
  ASSERT_GE(buckets, 4u);
  const auto t0 = std::chrono::steady_clock::now();
  auto answers =
      sender.update(Selector::kTarget, sent_at(2), kBucketBytes, "2", /*stop_after=*/buckets / 2);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].status, 504) << answers[0].body.dump();
  EXPECT_NE(answers[0].body.value("message", "").find("bucket " + std::to_string(buckets / 2)),
            std::string::npos)
      << answers[0].body.dump();
  EXPECT_LT(waited, 30s) << "answered within the engine's deadline, not the client's";
  EXPECT_EQ(digest(sender, 0, "target"), target_before);
  EXPECT_EQ(digest(sender, 0, "draft"), draft_before);
  EXPECT_EQ(sender.get(0, "/server_info").body["weight_version"], "1");
  // An id-less end is SGLang's dialect: its refusal is a 400.
  EXPECT_EQ(sender.post(0, "/end_weight_update", "").status, 400) << "the session was discarded";
  // Recovery: new init (new store server), full update.
  expect_all_200(sender.init(), "re-init");
  const auto sent = sent_at(3);
  expect_all_200(sender.update(Selector::kTarget, sent, kBucketBytes, "3"), "recovery update");
  EXPECT_EQ(tensor_digests(sender, 0, "target"), expected_digests(sent, Layout::kShuffle));
  EXPECT_EQ(sender.get(0, "/server_info").body["weight_version"], "3");
  const std::string metrics =
      weightcast::testing::EngineHttp(engine.endpoint.host, engine.endpoint.port).metrics();
  EXPECT_NE(metrics.find("weightcast_engine_updates_total{outcome=\"ok\"} 2"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("weightcast_engine_updates_total{outcome=\"failed\"} 1"),
            std::string::npos);
}

TEST(EngineProcess, PrintsHelpAndRefusesBadArguments) {
  Subprocess help({WEIGHTCAST_ENGINE_BIN, "--help"});
  const std::string out = help.drain(10s);
  EXPECT_EQ(help.wait(10s), 0);
  for (const char* flag :
       {"--host", "--port", "--token", "--ranks", "--draft", "--target-filter", "--draft-layout",
        "--model", "--seed", "--legacy-finalize", "--session-timeout-ms", "--max-bucket-bytes"}) {
    EXPECT_NE(out.find(flag), std::string::npos) << flag;
  }
  Subprocess bad({WEIGHTCAST_ENGINE_BIN, "--port", "0", "--target-layout", "diagonal"});
  EXPECT_NE(bad.wait(10s), 0);
  Subprocess bad_model({WEIGHTCAST_ENGINE_BIN, "--port", "0", "--model", "no-such-model"});
  EXPECT_EQ(bad_model.wait(10s), 2);
}

TEST(EngineProcess, StopsCleanlyOnSigterm) {
  auto engine = start_engine(1);
  engine.process.signal(SIGTERM);
  EXPECT_EQ(engine.process.wait(10s), 0);
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
