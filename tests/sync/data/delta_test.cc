// Delta codecs (sync/model/delta.h) and the drift model (sync/model/drift.h): every codec
// round-trips bit for bit at every change rate and size, gives up over its limit, and refuses
// payloads that are not valid for the bucket; drift changes the fraction of elements real
// training does and the same run gives the same bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "comm/errors.h"
#include "sync/model/delta.h"
#include "sync/model/drift.h"
#include "sync/model/model.h"

namespace weightcast::sync {
namespace {

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// `base` with about `fraction` of its 16-bit words changed.
std::vector<std::byte> changed(const std::vector<std::byte>& base, double fraction,
                               std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution pick(fraction);
  auto out = base;
  for (std::size_t i = 0; i + 1 < out.size(); i += 2) {
    if (pick(rng)) out[i] ^= std::byte{0x01};
  }
  if (out.size() % 2 == 1 && pick(rng)) out.back() ^= std::byte{0x80};
  return out;
}

class Codecs : public ::testing::TestWithParam<DeltaCodec> {};

TEST_P(Codecs, RoundTripIsBitExactAtEveryRateAndSize) {
  DeltaEncoder encoder(GetParam());
  DeltaDecoder decoder(GetParam());
  std::vector<std::byte> payload;
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096},
                           (std::size_t{3} << 20) + 3}) {
    const auto base = random_bytes(size, size);
    for (double fraction : {0.0, 0.001, 0.02, 0.3}) {
      const auto next = changed(base, fraction, size + 7);
      ASSERT_TRUE(encoder.encode(next, base, size + 64, payload))
          << to_string(GetParam()) << " size " << size << " fraction " << fraction;
      auto out = base;
      decoder.decode(payload, out);
      EXPECT_EQ(out, next) << to_string(GetParam()) << " size " << size << " fraction " << fraction;
    }
  }
}

TEST_P(Codecs, SmallChangesMakeSmallPayloads) {
  DeltaEncoder encoder(GetParam());
  std::vector<std::byte> payload;
  const std::size_t size = std::size_t{8} << 20;
  const auto base = random_bytes(size, 3);
  const auto next = changed(base, 0.02, 4);
  ASSERT_TRUE(encoder.encode(next, base, size, payload));
  // 2% of the words changed: every codec must beat a third of the bucket by far.
  EXPECT_LT(payload.size(), size / 5) << to_string(GetParam());
}

TEST_P(Codecs, GivesUpAtTheLimitWhenEverythingChanged) {
  DeltaEncoder encoder(GetParam());
  std::vector<std::byte> payload;
  const std::size_t size = std::size_t{16} << 20;
  const auto base = random_bytes(size, 5);
  const auto next = random_bytes(size, 6);
  EXPECT_FALSE(encoder.encode(next, base, size * 3 / 4, payload)) << to_string(GetParam());
  // Nothing changed: a tiny payload, and it decodes to the base.
  ASSERT_TRUE(encoder.encode(base, base, size / 100, payload));
  auto out = base;
  DeltaDecoder(GetParam()).decode(payload, out);
  EXPECT_EQ(out, base);
}

TEST_P(Codecs, RefusesPayloadsThatDoNotFitTheBucket) {
  DeltaEncoder encoder(GetParam());
  DeltaDecoder decoder(GetParam());
  std::vector<std::byte> payload;
  const auto base = random_bytes(70000, 8);
  const auto next = changed(base, 0.05, 9);
  ASSERT_TRUE(encoder.encode(next, base, base.size(), payload));
  ASSERT_GT(payload.size(), 1u);
  const std::vector<std::byte> truncated(payload.begin(), payload.end() - 1);
  auto longer = payload;
  longer.push_back(std::byte{0});
  auto out = base;
  EXPECT_THROW(decoder.decode(truncated, out), comm::BadRequestError);
  out = base;
  EXPECT_THROW(decoder.decode(longer, out), comm::BadRequestError);
  // The same payload for a bucket of another size.
  std::vector<std::byte> other(base.begin(), base.end() - 1);
  EXPECT_THROW(decoder.decode(payload, other), comm::BadRequestError);
}

INSTANTIATE_TEST_SUITE_P(Delta, Codecs,
                         ::testing::Values(DeltaCodec::kXorZstd, DeltaCodec::kXorLz4,
                                           DeltaCodec::kSparse),
                         [](const auto& param) { return std::string(to_string(param.param)); });

TEST(SparseDelta, RefusesIndicesOutOfOrderOrRange) {
  std::vector<std::byte> bucket(16);
  std::vector<std::byte> payload(8 + 12);
  payload[0] = std::byte{2};  // two entries: word 5 then word 3
  payload[8] = std::byte{5};
  payload[12] = std::byte{1};
  payload[14] = std::byte{3};
  payload[18] = std::byte{1};
  DeltaDecoder decoder(DeltaCodec::kSparse);
  EXPECT_THROW(decoder.decode(payload, bucket), comm::BadRequestError);
  payload[14] = std::byte{8};  // word 8 of an 8-word bucket
  EXPECT_THROW(decoder.decode(payload, bucket), comm::BadRequestError);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  // Exactly halfway between 0x3f80 and 0x3f81: ties go to the even one.
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(from_bf16(0x3f80), 1.0f);
}

TEST(Drift, ChangesAFewPercentOfElementsAndIsDeterministic) {
  const TensorMeta meta{"model.layers.0.mlp.up_proj.weight", DType::kBFloat16, {512, 1024}};
  std::vector<std::byte> initial(meta.byte_count());
  fill_tensor(meta, 1, 0, initial);
  Drift a(DType::kBFloat16, initial, 7, kRealisticLr);
  Drift b(DType::kBFloat16, initial, 7, kRealisticLr);
  auto wa = initial;
  auto wb = initial;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const std::size_t changed_a = a.step(step, wa);
    b.step(step, wb);
    const double fraction = static_cast<double>(changed_a) / static_cast<double>(a.elements());
    EXPECT_GT(fraction, 0.002) << "step " << step;
    EXPECT_LT(fraction, 0.08) << "step " << step;
    EXPECT_EQ(wa, wb) << "step " << step;
  }
  EXPECT_NE(wa, initial);
  EXPECT_THROW(Drift(DType::kInt8, initial, 7, kRealisticLr), comm::ConfigError);
}

// The MoE and MLA presets drift like dense ones: every tensor kind (router, experts, shared
// experts, MLA projections and norms) changes a few percent of its elements per step.
TEST(Drift, CoversTheMoeAndMlaPresets) {
  for (const char* preset : {"moe-tiny", "deepseek-tiny"}) {
    for (const auto& meta : hf_tensors(model_preset(preset))) {
      if (meta.byte_count() < 64 * 1024) continue;  // too few elements for a stable fraction
      std::vector<std::byte> bytes(meta.byte_count());
      fill_tensor(meta, 1, 0, bytes);
      Drift drift(meta.dtype, bytes, 7, kRealisticLr);
      const double fraction =
          static_cast<double>(drift.step(1, bytes)) / static_cast<double>(drift.elements());
      EXPECT_GT(fraction, 0.002) << preset << " " << meta.name;
      EXPECT_LT(fraction, 0.08) << preset << " " << meta.name;
    }
  }
}

}  // namespace
}  // namespace weightcast::sync
