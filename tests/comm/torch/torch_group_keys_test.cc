// torch-compatible groups without torch: the exact key bytes each torch key chain produces
// (checked against the chains written out in docs/interop.md, not against the code's own
// composition), and a torch-compatible Gloo group of ranks as threads: it uses only
// ProcessGroupGloo's keys, and broadcasts and barriers interleave as torch's tag sequence needs.
#include "comm/torch_group.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/errors.h"
#include "comm/store/memory_store.h"

namespace weightcast::comm {
namespace {

using std::chrono::milliseconds;

// A Store that remembers every key it was asked about, as it reached it.
class RecordingStore final : public Store {
 public:
  void set(const std::string& key, std::string_view value, Millis timeout) override {
    note(key);
    inner_.set(key, value, timeout);
  }
  std::string get(const std::string& key, Millis timeout) override {
    note(key);
    return inner_.get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    for (const auto& k : keys) note(k);
    inner_.wait(keys, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta, Millis timeout) override {
    note(key);
    return inner_.add(key, delta, timeout);
  }
  bool check(const std::string& key, Millis timeout) override {
    note(key);
    return inner_.check(key, timeout);
  }
  std::set<std::string> keys() {
    std::lock_guard lock(mu_);
    return keys_;
  }

 private:
  void note(const std::string& key) {
    std::lock_guard lock(mu_);
    keys_.insert(key);
  }
  MemoryStore inner_;
  std::mutex mu_;
  std::set<std::string> keys_;
};

std::string key_through(TorchKeys keys, std::string_view backend, const std::string& key) {
  auto rec = std::make_shared<RecordingStore>();
  torch_group_store(rec, "miles-pp_0", backend, keys)->set(key, "v", milliseconds(100));
  return *rec->keys().begin();
}

TEST(TorchGroupKeys, Torch1GlooChainIsGroupTwiceThenDeviceIndex) {
  // Recorded from torch 1.13 (SGLang's way, group miles-pp_0): /miles-pp_0/miles-pp_0/0/rank_1;
  // the leading "/" is the c10d client's.
  EXPECT_EQ(key_through(TorchKeys::kTorch1, "gloo", torch_gloo_device_prefix(0) + "/rank_1"),
            "miles-pp_0/miles-pp_0/0/rank_1");
}

TEST(TorchGroupKeys, Torch2ChainsCarryTheDeviceWithDoubledSlashes) {
  EXPECT_EQ(key_through(TorchKeys::kTorch2, "nccl", torch_nccl_unique_id_key(0)),
            "miles-pp_0/miles-pp_0//cuda//0");
  EXPECT_EQ(key_through(TorchKeys::kTorch2, "gloo", "0/1"), "miles-pp_0/miles-pp_0//cpu//0/1");
}

TEST(TorchGroupKeys, UniqueIdKeyCountsCommunicatorsFromZero) {
  EXPECT_EQ(torch_nccl_unique_id_key(0), "0");
  EXPECT_EQ(torch_nccl_unique_id_key(3), "3");
  EXPECT_THROW(torch_nccl_unique_id_key(-1), EnforceError);
}

TEST(TorchGroupKeys, MisuseIsRefused) {
  auto base = std::make_shared<MemoryStore>();
  EXPECT_THROW(torch_group_store(nullptr, "g", "gloo", TorchKeys::kTorch1), EnforceError);
  EXPECT_THROW(torch_group_store(base, "", "gloo", TorchKeys::kTorch1), EnforceError);
  EXPECT_THROW(torch_group_store(base, "g", "mpi", TorchKeys::kTorch2), EnforceError);
}

// Ranks as threads in a torch-compatible Gloo group over a recording store.
TEST(TorchCompatibleGloo, UsesOnlyProcessGroupGlooKeysAndDeliversEveryBroadcast) {
  constexpr int kSize = 3;
  auto rec = std::make_shared<RecordingStore>();
  auto store = torch_group_store(rec, "g", "gloo", TorchKeys::kTorch1);
  const std::vector<std::size_t> sizes = {1, 3, 4096, 1 << 20, 5'000'003};
  std::vector<std::vector<std::vector<std::uint8_t>>> got(kSize);
  std::vector<std::exception_ptr> errors(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions o = member_options(store, r, kSize, milliseconds(20000));
        o.torch_compatible = true;
        auto comm = create_communicator("gloo", o);
        std::mt19937 rng(7);
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const int root = static_cast<int>(i % kSize);
          std::vector<std::uint8_t> buf(sizes[i]);
          if (r == root) {
            for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
          }
          comm->broadcast({buf.data(), buf.size(), root, MemoryKind::kHost, {}, {}});
          if (i == 2) comm->barrier(milliseconds(20000));  // a tag of its own, as in torch
          got[static_cast<std::size_t>(r)].push_back(std::move(buf));
        }
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (int r = 1; r < kSize; ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], got[0]) << r;
  std::set<std::string> expected;
  for (int r = 0; r < kSize; ++r) {
    expected.insert("g/g/0/" + std::to_string(r));
    expected.insert("g/g/0/rank_" + std::to_string(r));
  }
  EXPECT_EQ(rec->keys(), expected);
}

}  // namespace
}  // namespace weightcast::comm
