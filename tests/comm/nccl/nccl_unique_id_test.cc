// The NCCL unique id's trip through the rendezvous Store, run against each Store implementation.
// None of these needs a GPU: ncclGetUniqueId only opens NCCL's bootstrap socket.
#include "comm/nccl/nccl_unique_id.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "comm/errors.h"
#include "comm/store/memory_store.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "comm/torch_group.h"

namespace weightcast::comm {
namespace {

using std::chrono::milliseconds;

// A store plus a way to open another client of the same data: a network client serializes its
// calls, so a rank that publishes while another waits needs its own client, as real ranks have.
struct StoreUnderTest {
  // Declared first so it is destroyed last: it holds what keeps a network server alive.
  std::function<std::shared_ptr<Store>()> another_client;
  std::shared_ptr<Store> store;
};

struct StoreKind {
  std::string name;
  std::function<StoreUnderTest()> make;
};

StoreUnderTest make_memory_store() {
  auto store = std::make_shared<MemoryStore>();
  return {[store] { return store; }, store};
}

StoreUnderTest make_tcp_store() {
  auto server = std::make_shared<TcpStoreServer>(TcpStoreServerOptions{});  // ephemeral port
  auto connect = [server]() -> std::shared_ptr<Store> {
    TcpStoreOptions opts;
    opts.host = server->host();
    opts.port = server->port();
    opts.connect_timeout = std::chrono::milliseconds(10000);
    return std::make_shared<TcpStore>(opts);
  };
  return {connect, connect()};
}

// Bytes 0..127 shifted by `salt`: contains NUL bytes, so a store that treats values as C strings
// would truncate it.
NcclUniqueIdBytes synthetic_id(int salt) {
  NcclUniqueIdBytes id;
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>((i + salt) & 0xff);
  return id;
}

class NcclUniqueIdStore : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override { under_test_ = GetParam().make(); }
  Store& store() { return *under_test_.store; }

  StoreUnderTest under_test_;
};

TEST_P(NcclUniqueIdStore, RoundTripsBinaryBytes) {
  const NcclUniqueIdBytes id = synthetic_id(0);
  publish_unique_id(store(), id, milliseconds(5000));
  EXPECT_EQ(fetch_unique_id(store(), milliseconds(5000)), id);
}

TEST_P(NcclUniqueIdStore, FetchWaitsForALatePublish) {
  const NcclUniqueIdBytes id = synthetic_id(7);
  auto publisher = under_test_.another_client();
  auto fetched =
      std::async(std::launch::async, [&] { return fetch_unique_id(store(), milliseconds(20000)); });
  EXPECT_EQ(fetched.wait_for(milliseconds(100)), std::future_status::timeout)
      << "fetch returned before the id was published";
  publish_unique_id(*publisher, id, milliseconds(5000));
  EXPECT_EQ(fetched.get(), id);
}

TEST_P(NcclUniqueIdStore, MissingIdTimesOutWithinBounds) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(fetch_unique_id(store(), milliseconds(300)), TimeoutError);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(250));    // it did wait
  EXPECT_LT(elapsed, milliseconds(15000));  // and did not hang
}

TEST_P(NcclUniqueIdStore, WrongSizeValueIsBadRequest) {
  for (const std::string& value : {std::string("short"), std::string(kNcclUniqueIdBytes + 1, 'x'),
                                   std::string(kNcclUniqueIdBytes - 1, '\0')}) {
    store().set(kNcclUniqueIdKey, value, milliseconds(5000));
    try {
      fetch_unique_id(store(), milliseconds(5000));
      ADD_FAILURE() << "a " << value.size() << "-byte value was accepted";
    } catch (const BadRequestError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(value.size()) + " bytes"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_P(NcclUniqueIdStore, PrefixStoresKeepGroupsApart) {
  auto shared = under_test_.store;
  PrefixStore stage0("group-pp_0", shared);
  PrefixStore stage1("group-pp_1", shared);
  publish_unique_id(stage0, synthetic_id(1), milliseconds(5000));
  publish_unique_id(stage1, synthetic_id(2), milliseconds(5000));
  EXPECT_EQ(fetch_unique_id(stage0, milliseconds(5000)), synthetic_id(1));
  EXPECT_EQ(fetch_unique_id(stage1, milliseconds(5000)), synthetic_id(2));
  EXPECT_THROW(fetch_unique_id(store(), milliseconds(50)), TimeoutError)
      << "the unscoped key must stay unset";
}

INSTANTIATE_TEST_SUITE_P(Stores, NcclUniqueIdStore,
                         ::testing::Values(StoreKind{"memory", make_memory_store},
                                           StoreKind{"tcp", make_tcp_store}),
                         [](const auto& param_info) { return param_info.param.name; });

// ncclGetUniqueId needs no GPU (only a network interface for its bootstrap listener); where it
// cannot create one, the reason is reported as a skip.
TEST(NcclUniqueId, CreateNeedsNoGpuAndGivesFreshIds) {
  NcclUniqueIdBytes a;
  NcclUniqueIdBytes b;
  try {
    a = create_nccl_unique_id();
    b = create_nccl_unique_id();
  } catch (const ConfigError& e) {
    GTEST_SKIP() << "ncclGetUniqueId is unavailable here: " << e.what();
  }
  EXPECT_NE(a, b) << "two groups would share a bootstrap id";
  EXPECT_TRUE(std::any_of(a.begin(), a.end(), [](char c) { return c != 0; }));
}

TEST(NcclUniqueId, CreatedIdRoundTripsThroughAStore) {
  NcclUniqueIdBytes id;
  try {
    id = create_nccl_unique_id();
  } catch (const ConfigError& e) {
    GTEST_SKIP() << "ncclGetUniqueId is unavailable here: " << e.what();
  }
  MemoryStore store;
  publish_unique_id(store, id, milliseconds(5000));
  EXPECT_EQ(store.get(kNcclUniqueIdKey, milliseconds(1000)).size(), kNcclUniqueIdBytes);
  EXPECT_EQ(fetch_unique_id(store, milliseconds(5000)), id);
}

// In a group with torch members the id sits where torch 2.x ProcessGroupNCCL reads it: key "0"
// under the group's chain, the raw 128 bytes (written out here, not composed by the code).
TEST(NcclUniqueId, TorchCompatibleGroupsUseProcessGroupNcclKey) {
  auto base = std::make_shared<MemoryStore>();
  auto group = torch_group_store(base, "miles-pp_0", "nccl", TorchKeys::kTorch2);
  const NcclUniqueIdBytes id = synthetic_id(5);
  publish_unique_id(*group, id, milliseconds(1000), torch_nccl_unique_id_key(0));
  EXPECT_EQ(base->get("miles-pp_0/miles-pp_0//cuda//0", milliseconds(1000)),
            std::string(id.data(), id.size()));
  EXPECT_EQ(fetch_unique_id(*group, milliseconds(1000), "0"), id);
  EXPECT_FALSE(base->check(kNcclUniqueIdKey, milliseconds(100)));
}

}  // namespace
}  // namespace weightcast::comm
