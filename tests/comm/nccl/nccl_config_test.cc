// Configuration errors of the NCCL backend that need no GPU: unusable devices, bad ordinals and
// host buffers are refused with the documented error kind before any rendezvous.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "comm/nccl/cuda_device.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/nccl_compat.h"
#include "comm/nccl/nccl_unique_id.h"
#include "comm/store/memory_store.h"
#include "tests/comm/nccl/nccl_test_util.h"

namespace weightcast::comm {
namespace {

using std::chrono::milliseconds;

CommOptions single_rank_options(std::shared_ptr<Store> store) {
  return member_options(std::move(store), 0, 1, milliseconds(5000));
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A broadcast of `host` (ordinary host memory) labelled as `memory`.
BroadcastOptions host_buffer_as(std::vector<char>& host, MemoryKind memory) {
  BroadcastOptions opts;
  opts.buffer = host.data();
  opts.bytes = host.size();
  opts.memory = memory;
  return opts;
}

TEST(NcclConfig, BackendIsListedWhenBuilt) {
  const auto backends = available_backends();
  EXPECT_NE(std::find(backends.begin(), backends.end(), "nccl"), backends.end());
}

TEST(NcclConfig, LinkedLibraryIsRecentEnough) {
  EXPECT_NO_THROW(nccl_compat::check_runtime_version());
}

TEST(NcclConfig, HostMemoryKindIsRefused) {
  std::vector<char> host(64);
  BroadcastOptions opts = host_buffer_as(host, MemoryKind::kHost);
  try {
    nccl_detail::check_device_buffer(opts, 0);
    FAIL() << "a host buffer was accepted";
  } catch (const EnforceError& e) {
    EXPECT_TRUE(contains(e.what(), "host")) << e.what();
  }
  opts.bytes = 0;  // refused even when there is nothing to move: the call itself is wrong
  EXPECT_THROW(nccl_detail::check_device_buffer(opts, 0), EnforceError);
}

TEST(NcclConfig, HostPointerLabelledCudaIsRefused) {
  // Without a GPU, CUDA cannot vouch for the pointer; with one, it reports unregistered memory.
  std::vector<char> host(64);
  EXPECT_THROW(nccl_detail::check_device_buffer(host_buffer_as(host, MemoryKind::kCuda), 0),
               EnforceError);
}

TEST(NcclConfig, NonexistentDeviceOrdinalIsConfigError) {
  auto store = std::make_shared<MemoryStore>();
  CommOptions opts = single_rank_options(store);
  opts.nccl.cuda_device = 4096;
  try {
    create_communicator("nccl", opts);
    FAIL() << "device 4096 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "CUDA")) << e.what();
  }
  EXPECT_FALSE(store->check(kNcclUniqueIdKey, milliseconds(100)))
      << "a rank that cannot run must not publish a unique id";
}

TEST(NcclConfig, OrdinalBelowMinusOneIsEnforceError) {
  CommOptions opts = single_rank_options(std::make_shared<MemoryStore>());
  opts.nccl.cuda_device = -2;
  EXPECT_THROW(create_communicator("nccl", opts), EnforceError);
}

TEST(NcclConfig, MissingStoreIsEnforceError) {
  CommOptions opts = single_rank_options(nullptr);
  EXPECT_THROW(create_nccl_communicator(opts), EnforceError);
}

TEST(NcclConfig, NoGpuIsConfigErrorForEveryRankWithoutWaiting) {
  const auto devices = nccl_testing::cuda_devices();
  if (devices.count > 0) {
    GTEST_SKIP() << "this machine has " << devices.count
                 << " CUDA device(s); NonexistentDeviceOrdinalIsConfigError covers it";
  }
  auto store = std::make_shared<MemoryStore>();
  for (int rank = 0; rank < 2; ++rank) {
    CommOptions opts = single_rank_options(store);
    opts.size = 2;
    opts.rank = rank;
    opts.timeout = milliseconds(60000);
    const auto start = std::chrono::steady_clock::now();
    try {
      create_communicator("nccl", opts);
      FAIL() << "rank " << rank << " formed a group without a GPU";
    } catch (const ConfigError& e) {
      // No device at all, or a runtime error named as such (never one dressed as the other).
      if (devices.error.empty()) {
        EXPECT_TRUE(contains(e.what(), "no CUDA device is visible")) << e.what();
      } else {
        EXPECT_TRUE(contains(e.what(), "CUDA runtime error while counting devices")) << e.what();
      }
    }
    // Fails fast: the 60 s rendezvous timeout is never waited out.
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(30000));
  }
  EXPECT_FALSE(store->check(kNcclUniqueIdKey, milliseconds(100)));
}

}  // namespace
}  // namespace weightcast::comm
