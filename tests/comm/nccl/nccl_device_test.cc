// NCCL backend on real GPUs: broadcast correctness, barriers, timeouts and abort. Ranks run as
// threads, one GPU each (NCCL refuses two ranks of a group on one GPU). Every test skips with the
// reason when the machine lacks the devices it needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "comm/store/memory_store.h"
#include "comm/torch_group.h"
#include "tests/comm/nccl/nccl_test_util.h"

namespace weightcast::comm {
namespace {

using nccl_testing::cuda_skip_reason;
using nccl_testing::DeviceBuffer;
using nccl_testing::pattern;
using nccl_testing::run_ranks;
using std::chrono::milliseconds;

#define REQUIRE_CUDA_DEVICES(n)                                                         \
  do {                                                                                  \
    if (const std::string why = cuda_skip_reason(n); !why.empty()) GTEST_SKIP() << why; \
  } while (false)

CommOptions options(std::shared_ptr<Store> store, int rank, int size, Millis timeout) {
  CommOptions opts = member_options(std::move(store), rank, size, timeout);
  opts.nccl.cuda_device = rank;
  return opts;
}

BroadcastOptions device_broadcast(const DeviceBuffer& buffer, int root) {
  BroadcastOptions opts;
  opts.buffer = buffer.data();
  opts.bytes = buffer.size();
  opts.root = root;
  opts.memory = MemoryKind::kCuda;
  return opts;
}

void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

int ranks_for_multi_gpu() {
  return std::min(nccl_testing::cuda_devices().count, 4);
}

TEST(NcclDevice, SingleRankBroadcastKeepsDataAndBarriers) {
  REQUIRE_CUDA_DEVICES(1);
  auto comm = create_communicator(
      "nccl", options(std::make_shared<MemoryStore>(), 0, 1, milliseconds(30000)));
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->size(), 1);
  for (std::size_t bytes :
       {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{8} << 20}) {
    DeviceBuffer buffer(0, bytes);
    const auto data = pattern(bytes, 11);
    buffer.upload(data);
    comm->broadcast(device_broadcast(buffer, 0));
    EXPECT_EQ(buffer.download(), data) << bytes << " bytes";
  }
  comm->barrier(milliseconds(10000));
  EXPECT_FALSE(comm->aborted());
}

TEST(NcclDevice, BroadcastReachesEveryGpuFromEveryRoot) {
  REQUIRE_CUDA_DEVICES(2);
  const int ranks = ranks_for_multi_gpu();
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<std::string>> wrong(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank) {
    auto comm = create_communicator("nccl", options(store, rank, ranks, milliseconds(60000)));
    for (int root = 0; root < ranks; ++root) {
      for (std::size_t bytes :
           {std::size_t{1}, (std::size_t{1} << 20) + 3, std::size_t{64} << 20}) {
        const auto expected = pattern(bytes, static_cast<std::uint32_t>(root * 100 + bytes));
        DeviceBuffer buffer(rank, bytes);
        buffer.upload(rank == root ? expected : pattern(bytes, 999 + rank));
        comm->broadcast(device_broadcast(buffer, root));
        if (buffer.download() != expected) {
          wrong[static_cast<std::size_t>(rank)].push_back("root " + std::to_string(root) + ", " +
                                                          std::to_string(bytes) + " bytes");
        }
      }
    }
    comm->barrier(milliseconds(30000));
  });
  rethrow_first(errors);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_TRUE(wrong[static_cast<std::size_t>(r)].empty())
        << "rank " << r << " got wrong bytes for " << wrong[static_cast<std::size_t>(r)].front();
  }
}

TEST(NcclDevice, HostBuffersAreRefusedAndLeaveTheGroupUsable) {
  REQUIRE_CUDA_DEVICES(1);
  auto comm = create_communicator(
      "nccl", options(std::make_shared<MemoryStore>(), 0, 1, milliseconds(30000)));
  std::vector<char> host(256);
  BroadcastOptions opts;
  opts.buffer = host.data();
  opts.bytes = host.size();
  opts.memory = MemoryKind::kHost;
  EXPECT_THROW(comm->broadcast(opts), EnforceError);
  opts.memory = MemoryKind::kCuda;  // mislabelled host memory
  EXPECT_THROW(comm->broadcast(opts), EnforceError);
  EXPECT_FALSE(comm->aborted()) << "misuse must not tear the group down";
  DeviceBuffer buffer(0, 256);
  EXPECT_NO_THROW(comm->broadcast(device_broadcast(buffer, 0)));
}

TEST(NcclDevice, RankWithoutRootTimesOutWithinBounds) {
  REQUIRE_CUDA_DEVICES(1);
  CommOptions opts = options(std::make_shared<MemoryStore>(), 1, 2, milliseconds(500));
  opts.nccl.cuda_device = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(create_communicator("nccl", opts), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(20000));
}

TEST(NcclDevice, MissingPeerTimesOutWhileFormingTheGroup) {
  REQUIRE_CUDA_DEVICES(1);
  // Rank 0 publishes the id and starts a non-blocking init that can never complete.
  auto store = std::make_shared<MemoryStore>();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(create_communicator("nccl", options(store, 0, 2, milliseconds(1500))), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(30000));
}

TEST(NcclDevice, TwoRanksOnOneGpuAreRefused) {
  REQUIRE_CUDA_DEVICES(1);
  auto store = std::make_shared<MemoryStore>();
  std::atomic<int> config_errors{0};
  const auto errors = run_ranks(2, [&](int rank) {
    CommOptions opts = options(store, rank, 2, milliseconds(20000));
    opts.nccl.cuda_device = 0;
    try {
      create_communicator("nccl", opts);
    } catch (const ConfigError&) {
      ++config_errors;
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
  EXPECT_GE(config_errors.load(), 1) << "NCCL's duplicate-GPU refusal should be a ConfigError";
}

// Two ranks with `timeout`: rank 0, the root, never broadcasts; it waits until rank 1's `receive`
// (given rank 1's communicator and a 16 MiB device buffer) has returned.
template <typename Receive>
void with_silent_root(milliseconds timeout, Receive receive) {
  auto store = std::make_shared<MemoryStore>();
  std::atomic<bool> receiver_done{false};
  const auto errors = run_ranks(2, [&](int rank) {
    auto comm = create_communicator("nccl", options(store, rank, 2, timeout));
    if (rank == 0) {
      while (!receiver_done) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    DeviceBuffer buffer(rank, 16 << 20);
    receive(*comm, buffer);
    receiver_done = true;
  });
  rethrow_first(errors);
}

TEST(NcclDevice, SilentRootTimesOutTheBroadcast) {
  REQUIRE_CUDA_DEVICES(2);
  with_silent_root(milliseconds(5000), [](Communicator& comm, DeviceBuffer& buffer) {
    BroadcastOptions opts = device_broadcast(buffer, 0);
    opts.timeout = milliseconds(1000);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(comm.broadcast(opts), TimeoutError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(20000));
    EXPECT_TRUE(comm.aborted());
    EXPECT_THROW(comm.broadcast(opts), TimeoutError) << "later calls fail the same way";
  });
}

TEST(NcclDevice, AbortFromAnotherThreadEndsABlockedBroadcast) {
  REQUIRE_CUDA_DEVICES(2);
  with_silent_root(milliseconds(60000), [](Communicator& comm, DeviceBuffer& buffer) {
    std::thread watchdog([&] {
      std::this_thread::sleep_for(milliseconds(300));
      comm.abort();
      comm.abort();  // idempotent
    });
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(comm.broadcast(device_broadcast(buffer, 0)), Error);
    watchdog.join();
    // Well before the 60 s timeout: abort() ended the wait, not the deadline.
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(30000));
    EXPECT_TRUE(comm.aborted());
  });
}

TEST(NcclDevice, AbortIsIdempotentAndFailsLaterCalls) {
  REQUIRE_CUDA_DEVICES(1);
  auto comm = create_communicator(
      "nccl", options(std::make_shared<MemoryStore>(), 0, 1, milliseconds(30000)));
  comm->abort();
  comm->abort();
  EXPECT_TRUE(comm->aborted());
  DeviceBuffer buffer(0, 64);
  EXPECT_THROW(comm->broadcast(device_broadcast(buffer, 0)), Error);
  DeviceBuffer empty(0, 0);
  EXPECT_THROW(comm->broadcast(device_broadcast(empty, 0)), Error);
  EXPECT_THROW(comm->barrier(milliseconds(1000)), Error);
}

// A torch-compatible group (as with SGLang engine ranks) forms under ProcessGroupNCCL's key and
// broadcasts device memory like any other.
TEST(NcclDevice, TorchCompatibleGroupFormsUnderTorchKeyAndBroadcasts) {
  REQUIRE_CUDA_DEVICES(1);
  const int ranks = ranks_for_multi_gpu();
  auto base = std::make_shared<MemoryStore>();
  auto store = torch_group_store(base, "miles-pp_0", "nccl", TorchKeys::kTorch2);
  rethrow_first(run_ranks(ranks, [&](int r) {
    auto opts = options(store, r, ranks, milliseconds(30000));
    opts.torch_compatible = true;
    auto comm = create_communicator("nccl", opts);
    DeviceBuffer buffer(r, 1 << 20);
    const auto data = pattern(1 << 20, 3);
    if (r == 0) buffer.upload(data);
    comm->broadcast(device_broadcast(buffer, 0));
    EXPECT_EQ(buffer.download(), data) << "rank " << r;
  }));
  EXPECT_TRUE(base->check("miles-pp_0/miles-pp_0//cuda//0", milliseconds(100)));
}

}  // namespace
}  // namespace weightcast::comm
