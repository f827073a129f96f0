// Mixed groups: real torch.distributed processes (torch_group_member.py, Debian's torch) and
// weightcast processes (torch_group_member) in one Gloo group of world size 4, each side running
// its own broadcast call, every member's bytes checked against the root's (XXH3-128 digests);
// and the fault case: a torch member SIGKILLed mid-broadcast.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/interop/torch_python.h"
#include "tests/support/subprocess.h"
#include "tests/support/time_bounds.h"

namespace weightcast::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

enum class Side { kWeightcast, kTorch };

// 20 tensors from 1 B to 64 MiB, cycling through int8, float32 and bfloat16.
std::string mixed_spec() {
  const std::vector<std::string> dtypes = {"int8", "float32", "bfloat16"};
  const std::vector<std::size_t> bytes = {1,        4,        6,        100,      4096,
                                          4098,     65536,    99996,    262144,   1048576,
                                          1048578,  3000000,  4194304,  8388608,  12582912,
                                          16777216, 25165824, 33554432, 50331648, 67108864};
  std::ostringstream os;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::string dtype = dtypes[i % dtypes.size()];
    const std::size_t size = dtype == "int8" ? 1 : dtype == "float32" ? 4 : 2;
    if (bytes[i] % size != 0) dtype = "int8";
    const std::size_t elem = dtype == "int8" ? 1 : dtype == "float32" ? 4 : 2;
    os << (i ? "," : "") << dtype << ":" << bytes[i] / elem;
  }
  return os.str();
}

struct Member {
  Side side;
  std::unique_ptr<Subprocess> proc;
};

std::vector<std::string> member_argv(Side side, int rank, int world, const std::string& spec,
                                     const std::string& store, int timeout_ms) {
  std::vector<std::string> argv;
  if (side == Side::kTorch) {
    argv = {torch_python(), interop_script("torch_group_member.py")};
  } else {
    argv = {WEIGHTCAST_TORCH_GROUP_MEMBER};
  }
  argv.insert(argv.end(),
              {"--rank", std::to_string(rank), "--world", std::to_string(world), "--group",
               "miles-pp_0", "--spec", spec, "--timeout-ms", std::to_string(timeout_ms)});
  if (store.empty()) {
    argv.push_back("--host-store");
  } else {
    argv.insert(argv.end(), {"--store-port", store});
  }
  return argv;
}

// Starts rank 0 (it hosts the store and reports its port), then the others.
std::vector<Member> start_group(const std::vector<Side>& sides, const std::string& spec,
                                int timeout_ms) {
  std::vector<Member> members;
  const int world = static_cast<int>(sides.size());
  members.push_back(
      {sides[0], std::make_unique<Subprocess>(member_argv(sides[0], 0, world, spec, "", timeout_ms),
                                              torch_env())});
  const auto port = members[0].proc->wait_for_line("port ", seconds(60));
  if (!port) {
    ADD_FAILURE() << "rank 0 reported no store port: " << members[0].proc->output();
    return members;
  }
  for (int r = 1; r < world; ++r) {
    members.push_back(
        {sides[r], std::make_unique<Subprocess>(
                       member_argv(sides[r], r, world, spec, *port, timeout_ms), torch_env())});
  }
  return members;
}

// digest lines of one member: index -> hex digest
std::map<int, std::string> digests_of(const std::string& output) {
  std::map<int, std::string> out;
  std::istringstream in(output);
  std::string word;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    int index = -1;
    std::string digest;
    if (ls >> word && word == "digest" && ls >> index >> digest) out[index] = digest;
  }
  return out;
}

void expect_same_bytes(std::vector<Member>& members, std::size_t count) {
  std::vector<std::map<int, std::string>> all;
  for (std::size_t r = 0; r < members.size(); ++r) {
    const std::string out = members[r].proc->drain(seconds(120));
    EXPECT_EQ(members[r].proc->wait(seconds(10)), 0) << "rank " << r << ":\n" << out;
    all.push_back(digests_of(out));
    ASSERT_EQ(all.back().size(), count) << "rank " << r << " output:\n" << out;
  }
  for (std::size_t r = 1; r < members.size(); ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT_EQ(all[r][static_cast<int>(i)], all[0][static_cast<int>(i)])
          << "rank " << r << " broadcast " << i;
    }
  }
}

class TorchGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (torch_python().empty()) GTEST_SKIP() << torch_missing_reason();
  }
};

TEST_F(TorchGroupTest, WeightcastSourceTorchAndWeightcastReceivers) {
  auto members = start_group(
      {Side::kWeightcast, Side::kTorch, Side::kWeightcast, Side::kWeightcast}, mixed_spec(), 60000);
  expect_same_bytes(members, 20);
}

TEST_F(TorchGroupTest, TorchSourceTorchAndWeightcastReceivers) {
  auto members = start_group({Side::kTorch, Side::kWeightcast, Side::kTorch, Side::kTorch},
                             mixed_spec(), 60000);
  expect_same_bytes(members, 20);
}

// A torch member dies in the middle of a 256 MiB broadcast: every weightcast member fails within
// its deadline with a typed error, and the ones that were exchanging data with it name it.
TEST_F(TorchGroupTest, TorchMemberKilledMidBroadcastFailsWeightcastMembersWithinDeadline) {
  const int timeout_ms = 8000;
  const std::string spec = "int8:1,uint8:268435456,uint8:268435456,uint8:268435456";
  auto members = start_group(
      {Side::kWeightcast, Side::kTorch, Side::kWeightcast, Side::kWeightcast}, spec, timeout_ms);
  ASSERT_EQ(members.size(), 4u);
  ASSERT_TRUE(members[1].proc->wait_for_line("digest 0 ", seconds(60)))
      << members[1].proc->output();
  std::this_thread::sleep_for(milliseconds(150));
  const auto killed_at = std::chrono::steady_clock::now();
  members[1].proc->signal(SIGKILL);
  for (int r : {0, 2, 3}) {
    const auto error =
        members[r].proc->wait_for_line("error ", late_bound(milliseconds(timeout_ms)));
    const auto took = std::chrono::steady_clock::now() - killed_at;
    ASSERT_TRUE(error) << "rank " << r << " did not fail:\n" << members[r].proc->output();
    EXPECT_TRUE(error->rfind("PeerError", 0) == 0 || error->rfind("TimeoutError", 0) == 0)
        << *error;
    EXPECT_LE(took, milliseconds(timeout_ms) + kSchedulingAllowance)
        << "rank " << r << ": " << *error;
    if (r == 0 || r == 3) {
      // The binomial tree's step 0 links rank 0 -> 1 and step 1 links rank 1 -> 3.
      EXPECT_NE(error->find("rank 1"), std::string::npos) << "rank " << r << ": " << *error;
    }
    std::cerr << "rank " << r << " failed after "
              << std::chrono::duration_cast<milliseconds>(took).count() << " ms: " << *error
              << "\n";
    EXPECT_EQ(members[r].proc->wait(seconds(10)), 3);
  }
}

}  // namespace
}  // namespace weightcast::testing
