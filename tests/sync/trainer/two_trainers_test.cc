// Two trainers with different seeds, one engine, real processes: trainer a updates the engine ten
// times with --verify; trainer b starts once a holds the engine and is refused at its first begin
// (409, naming a as the lease holder) and exits non-zero without touching a's sessions. a's first
// begin took a lease that every one of its sessions renews, so b cannot get in between two of
// a's sessions either (before leases it could: the engine then alternated between the two
// trainers' weights). After a exits (releasing its lease), a third trainer updates the engine.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "tests/sync/trainer/train_launch.h"

namespace weightcast::sync::trainer::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Polls /server_info until the engine reports a session open; false at the deadline.
bool wait_for_session(EngineClient& client, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (client.server_info().session_selector.has_value()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

TEST(TwoTrainers, LeaseKeepsTheSecondOutUntilTheFirstExitsThenAThirdGetsIn) {
  TestEngine engine = start_engine(1);
  auto a = start_trainer(1, {engine.url},
                         {"--group-prefix", "a", "--steps", "10", "--verify", "--bucket-bytes",
                          "64K", "--bucket-delay-ms", "20"});
  EngineClient client = test_client(engine.url);
  ASSERT_TRUE(wait_for_session(client, milliseconds(60000))) << a->output();

  constexpr int kRequestTimeoutMs = 10000;
  const auto b_start = std::chrono::steady_clock::now();
  auto b = start_trainer(1, {engine.url},
                         {"--group-prefix", "b", "--steps", "10", "--seed", "77",
                          "--request-timeout-ms", std::to_string(kRequestTimeoutMs)});
  const auto b_code = b->wait(seconds(60));
  const auto b_took = std::chrono::steady_clock::now() - b_start;
  const std::string b_out = b->drain(seconds(5));
  EXPECT_NE(b_code, std::optional<int>(0)) << b_out;
  EXPECT_TRUE(b_code.has_value()) << b_out;
  EXPECT_LT(b_took, milliseconds(kRequestTimeoutMs)) << b_out;
  // b names a (its holder text ends with a's group prefix) and does nothing else.
  EXPECT_EQ(count_matches(b_out,
                          "step 1/10 FAILED version [0-9]+: .*engine busy.*engine leased by "
                          "'[^']*:[0-9]+ a' for [0-9]+ more s"),
            1)
      << b_out;
  EXPECT_EQ(count_matches(b_out, "step 2/10"), 0) << b_out;
  std::printf("trainer b: exit %d after %.1f s (request timeout %.1f s)\n", b_code.value_or(-1),
              std::chrono::duration<double>(b_took).count(), kRequestTimeoutMs / 1000.0);

  const auto a_code = a->wait(seconds(90));
  const std::string a_out = a->drain(seconds(5));
  ASSERT_EQ(a_code, std::optional<int>(0)) << a_out << "\n--- b:\n" << b_out;
  for (int step = 1; step <= 10; ++step) {
    const std::string s = std::to_string(step);
    EXPECT_EQ(count_matches(a_out, "step " + s + "/10 version " + s + " .* verified yes"), 1)
        << a_out;
  }
  // The engine holds a's last version, and a's --verify compared every digest at every step.
  const auto info = client.server_info();
  EXPECT_EQ(info.weight_version, "10");
  EXPECT_FALSE(info.session_selector.has_value());
  const auto a_weights = client.weights_checksum(Runner::kTarget);
  EXPECT_EQ(a_weights.weight_version, "10");

  // a released its lease on exit: a third trainer gets the engine at once.
  auto c = start_trainer(1, {engine.url},
                         {"--group-prefix", "c", "--steps", "1", "--seed", "78", "--verify"});
  const auto c_code = c->wait(seconds(60));
  const std::string c_out = c->drain(seconds(5));
  ASSERT_EQ(c_code, std::optional<int>(0)) << c_out;
  EXPECT_EQ(count_matches(c_out, "step 1/1 version 11 .* verified yes"), 1) << c_out;
  EXPECT_NE(client.weights_checksum(Runner::kTarget).digest, a_weights.digest);
}

}  // namespace
}  // namespace weightcast::sync::trainer::testing
