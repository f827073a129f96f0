// ReceiverBase: recording a commit's tensors in name order (each lookup starting where the last
// one ended) keeps exactly what recording them one by one keeps, whatever the maps held before:
// a full update, a partial one, new names among old ones.
#include "sync/engine/commit/receiver_base.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <tuple>

#include "sync/model/checksum.h"

namespace weightcast::sync::engine {
namespace {

struct Entry {
  TensorMeta meta;
  SharedBytes bytes;
  Digest digest;
};

std::map<std::string, Entry> random_commit(std::mt19937& rng, int names) {
  std::map<std::string, Entry> out;
  for (int i = 0; i < names; ++i) {
    if (rng() % 3 == 0) continue;  // this commit leaves the name out
    const std::string name = "model.layers." + std::to_string(i) + ".w";
    std::vector<std::byte> bytes(2 * (1 + rng() % 8));
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    Entry e{{name, DType::kBFloat16, {static_cast<std::int64_t>(bytes.size() / 2)}},
            SharedBytes::copy_of(bytes),
            tensor_digest(bytes)};
    out.emplace(name, std::move(e));
  }
  return out;
}

TEST(ReceiverBase, RecordingInNameOrderKeepsWhatRecordingOneByOneKeeps) {
  for (const bool keep : {false, true}) {
    for (std::uint32_t seed = 0; seed < 20; ++seed) {
      std::mt19937 rng(seed);
      ReceiverBase one_by_one(keep);
      ReceiverBase in_order(keep);
      // Commits alternate between the runners, which share the kept bytes (keyed by name).
      for (int commit = 0; commit < 6; ++commit) {
        const Runner runner = commit % 3 == 2 ? Runner::kDraft : Runner::kTarget;
        const auto tensors = random_commit(rng, 40);
        std::size_t expected_bytes = 0;
        for (const auto& [name, e] : tensors) {
          one_by_one.record(runner, e.meta, e.bytes, e.digest);
          expected_bytes += e.bytes.size();
        }
        const std::size_t recorded =
            in_order.record_in_order(runner, tensors, [](const auto& entry) {
              return std::tie(entry.second.meta, entry.second.bytes, entry.second.digest);
            });
        EXPECT_EQ(recorded, expected_bytes);
        for (Runner id : {Runner::kTarget, Runner::kDraft}) {
          EXPECT_EQ(in_order.digests(id), one_by_one.digests(id));
        }
        EXPECT_EQ(in_order.bytes(), one_by_one.bytes());
        EXPECT_EQ(in_order.held_digest(Selector::kAll), one_by_one.held_digest(Selector::kAll));
        for (const auto& [name, digest] : one_by_one.digests(runner)) {
          const auto* a = one_by_one.base_of(name);
          const auto* b = in_order.base_of(name);
          ASSERT_EQ(a == nullptr, b == nullptr) << name;
          if (a == nullptr) continue;
          EXPECT_EQ(a->meta, b->meta);
          EXPECT_EQ(tensor_digest(a->bytes.span()), tensor_digest(b->bytes.span())) << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace weightcast::sync::engine
