// One behavioural suite for every Store: MemoryStore, PrefixStore over MemoryStore, TcpStore
// against an in-test TcpStoreServer on an ephemeral port, and C10dStore against C10dStoreServer in
// both torch generations. Each backend provides a "primary" handle and "peer" handles onto the
// same data (for the network stores, separate client connections, because a client serializes
// its calls and a blocked get would hold up a set on the same connection).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <set>
#include <thread>

#include "comm/errors.h"
#include "comm/store/c10d_store.h"
#include "comm/store/c10d_store_server.h"
#include "comm/store/memory_store.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "tests/support/time_bounds.h"

namespace weightcast::comm {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kMaxValue = 64 * 1024;

// Shared data plus a way to open more handles onto it.
struct Backend {
  std::shared_ptr<void> keepalive;  // the server or inner store
  std::function<std::shared_ptr<Store>()> open;
};

struct BackendParam {
  const char* name;
  std::function<Backend()> make;
  // torch's protocol has no error replies: a refused ADD drops the connection (PeerError).
  bool typed_add_errors = true;
};

Backend memory_backend() {
  auto store = std::make_shared<MemoryStore>(kMaxValue);
  return {store, [store] { return store; }};
}

Backend prefix_backend() {
  auto inner = std::make_shared<MemoryStore>(kMaxValue);
  return {inner, [inner] { return std::make_shared<PrefixStore>("group0", inner); }};
}

Backend tcp_backend() {
  TcpStoreServerOptions sopts;
  sopts.max_value_bytes = kMaxValue;
  auto server = std::make_shared<TcpStoreServer>(sopts);
  return {server, [server] {
            TcpStoreOptions copts;
            copts.port = server->port();
            copts.connect_timeout = 5s;
            copts.max_value_bytes = kMaxValue;
            return std::make_shared<TcpStore>(copts);
          }};
}

Backend c10d_backend(C10dProtocol protocol) {
  C10dStoreServerOptions sopts;
  sopts.max_value_bytes = kMaxValue;
  auto server = std::make_shared<C10dStoreServer>(sopts);
  return {server, [server, protocol] {
            C10dStoreOptions copts;
            copts.port = server->port();
            copts.protocol = protocol;
            copts.connect_timeout = 5s;
            copts.max_value_bytes = kMaxValue;
            return std::make_shared<C10dStore>(copts);
          }};
}

Backend c10d1_backend() {
  return c10d_backend(C10dProtocol::kTorch1);
}
Backend c10d2_backend() {
  return c10d_backend(C10dProtocol::kTorch2);
}

class StoreConformance : public ::testing::TestWithParam<BackendParam> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    store_ = backend_.open();
  }
  std::shared_ptr<Store> peer() { return backend_.open(); }

  Backend backend_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreConformance, SetThenGetAndOverwrite) {
  store_->set("alpha", "one", 1s);
  EXPECT_EQ(store_->get("alpha", 1s), "one");
  store_->set("alpha", "two", 1s);
  EXPECT_EQ(store_->get("alpha", 1s), "two");
  EXPECT_EQ(peer()->get("alpha", 1s), "two");
}

TEST_P(StoreConformance, GetWaitsForALaterSetFromAnotherThread) {
  auto setter_store = peer();
  std::atomic<bool> set_done{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(150ms);
    set_done = true;
    setter_store->set("late", "arrived", 2s);
  });
  EXPECT_EQ(store_->get("late", 10s), "arrived");
  EXPECT_TRUE(set_done.load());  // the get returned because of the set, not before it
  setter.join();
}

TEST_P(StoreConformance, WaitOnSeveralKeys) {
  auto setter_store = peer();
  std::thread setter([&] {
    for (const char* k : {"k1", "k2", "k3"}) {
      std::this_thread::sleep_for(30ms);
      setter_store->set(k, k, 2s);
    }
  });
  store_->wait({"k1", "k2", "k3"}, 10s);
  setter.join();
  for (const char* k : {"k1", "k2", "k3"}) EXPECT_TRUE(store_->check(k, 1s)) << k;
  store_->wait({}, 1s);  // nothing to wait for
}

TEST_P(StoreConformance, WaitOnMissingKeyTimesOutInBoundsAndNamesIt) {
  store_->set("present", "x", 1s);
  const auto timeout = 500ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    store_->wait({"present", "absent-key"}, timeout);
    FAIL() << "wait on a missing key returned";
  } catch (const TimeoutError& e) {
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, timeout / 2);
    EXPECT_LE(elapsed, weightcast::testing::late_bound(timeout));
    const std::string what = e.what();
    EXPECT_NE(what.find("absent-key"), std::string::npos) << what;
    EXPECT_EQ(what.find("present"), std::string::npos) << what;
  }
}

TEST_P(StoreConformance, GetOnMissingKeyTimesOutNamingItAndStoreStaysUsable) {
  try {
    store_->get("never-set", 200ms);
    FAIL() << "get on a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never-set"), std::string::npos) << e.what();
  }
  store_->set("after", "ok", 1s);
  EXPECT_EQ(store_->get("after", 1s), "ok");
}

TEST_P(StoreConformance, AddIsAtomicUnderManyThreads) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 100;
  std::vector<std::shared_ptr<Store>> handles;
  // Half the threads share the primary handle (contention on one client), half have their own.
  for (int t = 0; t < kThreads; ++t) handles.push_back(t % 2 ? store_ : peer());
  std::vector<std::vector<std::int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(handles[t]->add("counter", 1, 10s));
    });
  }
  for (auto& th : threads) th.join();
  std::set<std::int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), std::size_t{kThreads * kAdds});  // every add saw a distinct value
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  EXPECT_EQ(store_->get("counter", 1s), std::to_string(kThreads * kAdds));
  EXPECT_EQ(store_->add("counter", -kThreads * kAdds - 5, 1s), -5);
}

TEST_P(StoreConformance, AddOnNonCounterOrOverflowIsBadRequest) {
  if (!GetParam().typed_add_errors) {
    GTEST_SKIP() << "torch's TCPStore protocol has no error reply; the server drops the connection";
  }
  store_->set("text", "not a number", 1s);
  EXPECT_THROW(store_->add("text", 1, 1s), BadRequestError);
  EXPECT_EQ(store_->get("text", 1s), "not a number");
  store_->add("big", INT64_MAX, 1s);
  EXPECT_THROW(store_->add("big", 1, 1s), BadRequestError);
  EXPECT_EQ(store_->add("big", 0, 1s), INT64_MAX);  // unchanged and the handle still works
}

TEST_P(StoreConformance, CheckDoesNotWait) {
  EXPECT_FALSE(store_->check("maybe", 1s));
  store_->set("maybe", "yes", 1s);
  EXPECT_TRUE(store_->check("maybe", 1s));
  EXPECT_TRUE(peer()->check("maybe", 1s));
}

TEST_P(StoreConformance, BinaryValuesWithNulBytesRoundTrip) {
  std::string value;
  for (int i = 0; i < 512; ++i) value.push_back(static_cast<char>(i % 256));
  value += std::string("\0\0tail\0", 7);
  store_->set("binary", value, 1s);
  EXPECT_EQ(peer()->get("binary", 1s), value);
  const std::string nul_key("key\x01\xff", 5);
  store_->set(nul_key, std::string(3, '\0'), 1s);
  EXPECT_EQ(store_->get(nul_key, 1s), std::string(3, '\0'));
}

TEST_P(StoreConformance, EmptyValueIsAValue) {
  store_->set("empty", "", 1s);
  EXPECT_TRUE(store_->check("empty", 1s));
  EXPECT_EQ(store_->get("empty", 1s), "");
  store_->wait({"empty"}, 1s);
}

TEST_P(StoreConformance, OversizedOrEmptyKeyIsEnforceError) {
  // PrefixStore's prefix counts against the limit, so "longest" leaves room for one.
  const std::string longest(Store::kMaxKeyBytes - 64, 'k');
  const std::string too_long(Store::kMaxKeyBytes + 1, 'k');
  store_->set(longest, "fits", 1s);
  EXPECT_EQ(store_->get(longest, 1s), "fits");
  EXPECT_THROW(store_->set(too_long, "v", 1s), EnforceError);
  EXPECT_THROW(store_->get(too_long, 1s), EnforceError);
  EXPECT_THROW(store_->wait({"ok", too_long}, 1s), EnforceError);
  EXPECT_THROW(store_->add(too_long, 1, 1s), EnforceError);
  EXPECT_THROW(store_->check(too_long, 1s), EnforceError);
  EXPECT_THROW(store_->set("", "v", 1s), EnforceError);
}

TEST_P(StoreConformance, OversizedValueIsBadRequest) {
  EXPECT_EQ(store_->max_value_bytes(), kMaxValue);
  const std::string largest(kMaxValue, 'v');
  store_->set("largest", largest, 1s);
  EXPECT_EQ(store_->get("largest", 1s), largest);
  EXPECT_THROW(store_->set("too-big", std::string(kMaxValue + 1, 'v'), 1s), BadRequestError);
  EXPECT_FALSE(store_->check("too-big", 1s));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance,
                         ::testing::Values(BackendParam{"Memory", memory_backend},
                                           BackendParam{"PrefixOverMemory", prefix_backend},
                                           BackendParam{"Tcp", tcp_backend},
                                           BackendParam{"C10dTorch1", c10d1_backend, false},
                                           BackendParam{"C10dTorch2", c10d2_backend, false}),
                         [](const auto& p) { return std::string(p.param.name); });

// Prefixes scope keys: the same key under two prefixes is two keys, on any inner store.
void expect_prefixes_do_not_collide(const std::shared_ptr<Store>& inner) {
  PrefixStore a("stage0", inner);
  PrefixStore b("stage1", inner);
  a.set("addr", "from-a", 1s);
  EXPECT_FALSE(b.check("addr", 1s));
  b.set("addr", "from-b", 1s);
  EXPECT_EQ(a.get("addr", 1s), "from-a");
  EXPECT_EQ(b.get("addr", 1s), "from-b");
  EXPECT_EQ(a.add("n", 1, 1s), 1);
  EXPECT_EQ(b.add("n", 5, 1s), 5);
  EXPECT_EQ(inner->get("stage0/addr", 1s), "from-a");
  a.set("only-in-a", "x", 1s);
  EXPECT_THROW(b.wait({"only-in-a"}, 100ms), TimeoutError);
}

TEST(PrefixStoreTest, TwoPrefixesDoNotCollideOverMemory) {
  expect_prefixes_do_not_collide(std::make_shared<MemoryStore>());
}

TEST(PrefixStoreTest, TwoPrefixesDoNotCollideOverTcp) {
  TcpStoreServer server({});
  TcpStoreOptions copts;
  copts.port = server.port();
  expect_prefixes_do_not_collide(std::make_shared<TcpStore>(copts));
}

TEST(PrefixStoreTest, RejectsEmptyPrefixAndNullStore) {
  EXPECT_THROW(PrefixStore("", std::make_shared<MemoryStore>()), EnforceError);
  EXPECT_THROW(PrefixStore("p", nullptr), EnforceError);
}

}  // namespace
}  // namespace weightcast::comm
