// A build without NCCL must refuse the "nccl" backend with a ConfigError that says how to get it.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "comm/store/memory_store.h"

namespace weightcast::comm {
namespace {

TEST(NcclNotBuilt, BackendIsRefusedWithHowToEnableIt) {
  CommOptions opts;
  opts.store = std::make_shared<MemoryStore>();
  opts.rank = 0;
  opts.size = 1;
  try {
    create_communicator("nccl", opts);
    FAIL() << "a build without NCCL created an nccl communicator";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("WEIGHTCAST_WITH_NCCL=ON"), std::string::npos) << e.what();
  }
  const auto backends = available_backends();
  EXPECT_EQ(std::find(backends.begin(), backends.end(), "nccl"), backends.end());
}

}  // namespace
}  // namespace weightcast::comm
