// DeltaSource under --delta auto keeps measuring (issue 24): it decides on measured rates, and
// re-measures what it decided on every kRecheckEvery updates, so a decision made once is not kept
// forever; change() says when the decision flipped. Driven here with a link it is told about
// (note_full_broadcast) and buckets whose change between updates is chosen: small changes
// compress, random bytes do not.
#include "sync/trainer/delta_source.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

namespace weightcast::sync::trainer {
namespace {

constexpr std::size_t kTensorBytes = 1 << 20;

struct Stage {
  std::vector<BucketPlan> plans;
  std::vector<std::vector<std::byte>> buckets;  // the bytes of each bucket this update
};

Stage make_stage() {
  std::vector<TensorMeta> metas;
  for (int i = 0; i < 4; ++i) {
    metas.push_back(
        {"w" + std::to_string(i), DType::kUInt8, {static_cast<std::int64_t>(kTensorBytes)}});
  }
  Stage s;
  s.plans = plan_buckets(metas, 2 * kTensorBytes, kDefaultBucketAlignment);
  for (const auto& p : s.plans) s.buckets.emplace_back(p.total_bytes);
  return s;
}

// One update through `source`: which buckets went as deltas, and the link it was told about.
struct Sent {
  bool deltas_expected = false;  // begin()'s answer
  std::vector<bool> delta;       // per bucket
  std::string change;
};

Sent update(DeltaSource& source, Stage& stage, std::optional<std::string> base,
            const std::string& version, double link_bytes_per_s) {
  Sent out;
  out.deltas_expected = source.begin(stage.plans, base);
  out.change = source.change();
  std::vector<std::byte> payload;
  for (std::size_t k = 0; k < stage.plans.size(); ++k) {
    const auto d = source.encode(k, stage.buckets[k], payload);
    out.delta.push_back(d.has_value());
    if (!d) {
      const double bytes = static_cast<double>(stage.buckets[k].size());
      source.note_full_broadcast(stage.buckets[k].size(), bytes / link_bytes_per_s);
    }
  }
  source.finish(true, version);
  return out;
}

void drift(Stage& s, std::mt19937_64& rng, bool random) {
  for (auto& b : s.buckets) {
    if (random) {
      for (std::size_t i = 0; i + 8 <= b.size(); i += 8) {
        const std::uint64_t x = rng();
        std::memcpy(b.data() + i, &x, 8);
      }
    } else {
      for (std::size_t i = rng() % 997; i < b.size(); i += 997) b[i] ^= std::byte{1};
    }
  }
}

TEST(DeltaAuto, KeepsMeasuringAndSaysWhenItChangesItsMind) {
  DeltaSource source(kDefaultDeltaCodec, DeltaMode::kAuto);
  Stage stage = make_stage();
  std::mt19937_64 rng(7);
  constexpr double kSlowLink = 20e6;  // 20 MB/s: small deltas pay
  std::uint64_t v = 0;
  auto next = [&](bool random) {
    drift(stage, rng, random);
    const std::optional<std::string> base =
        source.version() ? source.version() : std::optional<std::string>();
    return update(source, stage, base, std::to_string(++v), kSlowLink);
  };

  // 1: full, measures the link. 2: deltas pay on it (calibration): keeps a base. 3: deltas.
  EXPECT_FALSE(next(false).deltas_expected);
  Sent s = next(false);
  EXPECT_EQ(s.change, "") << "a first decision is no change of mind";
  s = next(false);
  EXPECT_TRUE(s.deltas_expected);
  EXPECT_TRUE(s.delta[1]) << "small changes travel as deltas";

  // The link is re-measured while deltas pay: within kRecheckEvery updates one sends bucket 0 in
  // full, the others stay deltas.
  bool relinked = false;
  for (std::uint64_t i = 0; i < kRecheckEvery; ++i) {
    s = next(false);
    EXPECT_TRUE(s.delta[1]);
    relinked = relinked || !s.delta[0];
  }
  EXPECT_TRUE(relinked) << "no full bucket re-measured the link";

  // The model's changes stop compressing: the measured payload ratio turns the decision, and the
  // report says so once.
  std::vector<std::string> changes;
  for (int i = 0; i < 6; ++i) {
    s = next(true);
    if (!changes.empty()) {
      // Decided against: a re-check may encode to measure, but sends nothing that does not pay.
      for (bool d : s.delta) EXPECT_FALSE(d) << "a delta after deciding against them";
    }
    if (!s.change.empty()) changes.push_back(s.change);
  }
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NE(changes[0].find("delta auto: deltas no longer pay (payload "), std::string::npos)
      << changes[0];
  std::printf("%s\n", changes[0].c_str());

  // It keeps measuring: once the changes are small again, a re-check (a base kept every
  // kRecheckEvery updates, real buckets encoded the next) finds deltas pay, and says so.
  changes.clear();
  bool deltas_again = false;
  for (std::uint64_t i = 0; i < 3 * kRecheckEvery; ++i) {
    s = next(false);
    if (!s.change.empty()) changes.push_back(s.change);
    deltas_again = deltas_again || (s.deltas_expected && s.delta[1]);
  }
  EXPECT_TRUE(deltas_again) << "--delta auto stopped learning";
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NE(changes[0].find("delta auto: deltas now pay"), std::string::npos) << changes[0];
  std::printf("%s\n", changes[0].c_str());
}

TEST(DeltaAuto, OnAFastLinkItsReChecksSendNoDelta) {
  DeltaSource source(kDefaultDeltaCodec, DeltaMode::kAuto);
  Stage stage = make_stage();
  std::mt19937_64 rng(11);
  constexpr double kFastLink = 1e12;  // far faster than any encoder
  std::optional<std::string> base;
  int deltas = 0;
  int sampled = 0;
  const std::size_t sample_limit = stage.plans.size() * kSampleSlices * kSampleSliceBytes;
  ASSERT_LT(sample_limit, stage.plans.size() * 2 * kTensorBytes) << "buckets larger than samples";
  for (std::uint64_t v = 1; v <= 3 * kRecheckEvery; ++v) {
    drift(stage, rng, false);
    const Sent s = update(source, stage, base, std::to_string(v), kFastLink);
    EXPECT_EQ(s.change, "");
    for (bool d : s.delta) deltas += d ? 1 : 0;
    base = source.version();
    // A re-check keeps slices of the buckets, never a copy of the stage.
    EXPECT_LE(source.kept_bytes(), sample_limit) << "after update " << v;
    sampled += source.kept_bytes() > 0 ? 1 : 0;
  }
  EXPECT_EQ(deltas, 0) << "a delta on a link faster than the encoder";
  EXPECT_GE(sampled, 2) << "no re-check sampled the buckets";
}

}  // namespace
}  // namespace weightcast::sync::trainer
