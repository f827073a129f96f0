// sync/engine/lora/adapter_store.h: adapters swapped in whole under their names; a holder keeps
// the adapter it took; refusals change nothing.
#include "sync/engine/lora/adapter_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "sync/engine/commit/receiver_loader.h"

namespace weightcast::sync::engine {
namespace {

std::shared_ptr<const Adapter> make(const std::string& name, std::byte fill, std::string version) {
  auto a = std::make_shared<Adapter>();
  a->name = name;
  a->config = parse_lora_config(R"({"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]})");
  a->version = std::move(version);
  for (LoraPart part : {LoraPart::kA, LoraPart::kB}) {
    a->tensors.push_back(
        {lora_tensor_name("model.layers.0.self_attn.q_proj", part), DType::kBFloat16, {2, 2}});
    a->bytes.push_back(SharedBytes::adopt(std::vector<std::byte>(8, fill)));
    a->digests.push_back(tensor_digest(a->bytes.back()));
  }
  return a;
}

TEST(LoraAdapterStore, LoadUpsertUnload) {
  AdapterStore store;
  store.put(make("math", std::byte{1}, "1"), AdapterStore::Put::kLoad);
  const auto held = store.find("math");
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->version, "1");
  EXPECT_EQ(held->byte_count(), 16u);
  try {
    store.put(make("math", std::byte{2}, "2"), AdapterStore::Put::kLoad);
    FAIL() << "a second load of one name was accepted";
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 409);
    EXPECT_NE(std::string(e.what()).find("upsert"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.find("math")->version, "1");  // the refusal changed nothing
  store.put(make("math", std::byte{2}, "2"), AdapterStore::Put::kUpsert);
  EXPECT_EQ(store.find("math")->version, "2");
  EXPECT_NE(store.find("math")->combined_digest(), held->combined_digest());
  EXPECT_EQ(held->version, "1");  // a holder keeps what it took
  EXPECT_EQ(held->bytes[0].data()[0], std::byte{1});
  EXPECT_TRUE(store.unload("math"));
  EXPECT_FALSE(store.unload("math"));
  EXPECT_EQ(store.find("math"), nullptr);
  EXPECT_EQ(held->bytes[1].data()[7], std::byte{1});
}

TEST(LoraAdapterStore, LimitIsA507AndAnUpsertUnderItStillWorks) {
  AdapterStore store(2);
  store.put(make("a", std::byte{1}, "1"), AdapterStore::Put::kLoad);
  store.put(make("b", std::byte{1}, "1"), AdapterStore::Put::kLoad);
  try {
    store.put(make("c", std::byte{1}, "1"), AdapterStore::Put::kUpsert);
    FAIL() << "a third adapter was accepted";
  } catch (const ReceiverError& e) {
    EXPECT_EQ(e.status(), 507);
  }
  store.put(make("b", std::byte{3}, "2"), AdapterStore::Put::kUpsert);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"a", "b"}));
}

TEST(LoraAdapterStore, ReadersSeeOneWholeAdapterWhileItIsSwapped) {
  AdapterStore store;
  store.put(make("x", std::byte{0}, "0"), AdapterStore::Put::kLoad);
  std::atomic<bool> stop{false};
  std::atomic<int> mixed{0};
  std::thread reader([&] {
    while (!stop) {
      const auto a = store.find("x");
      const std::byte first = a->bytes[0].data()[0];
      for (const auto& b : a->bytes)
        for (std::byte v : b.span())
          if (v != first) ++mixed;
    }
  });
  for (int i = 1; i < 200; ++i) {
    store.put(make("x", std::byte(static_cast<unsigned char>(i)), std::to_string(i)),
              AdapterStore::Put::kUpsert);
  }
  stop = true;
  reader.join();
  EXPECT_EQ(mixed.load(), 0);
  EXPECT_EQ(store.find("x")->version, "199");
}

}  // namespace
}  // namespace weightcast::sync::engine
