// fill_tensor(): a counter-based generator, so any tensor (and any part of it) is computed
// independently of every other, in any order, on any machine.
//
// The stream key is XXH3-64 of the name (seeded with the run's seed) mixed with the step; word
// j of the stream is the SplitMix64 finalizer of key + (j + 1) * golden ratio. Each 64-bit word
// is cut into little-endian lanes of the element width, and each lane is mapped to a value of
// the dtype by bit operations only (no float arithmetic, so no rounding-mode or FMA drift).
#include <xxhash.h>

#include <bit>
#include <cstring>

#include "comm/errors.h"
#include "sync/model.h"

namespace weightcast::sync {
namespace {

static_assert(std::endian::native == std::endian::little,
              "fill_tensor stores lanes in native order and promises little-endian bytes");

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A floating type with M mantissa bits: keep sign and mantissa from the random lane, take the
// biased exponent from `base` + 3 random bits. base and base + 7 are normal, finite exponents.
template <typename U, int M, U kBase>
constexpr U float_lane(U r) {
  constexpr U kSign = static_cast<U>(U{1} << (8 * sizeof(U) - 1));
  constexpr U kMant = static_cast<U>((U{1} << M) - 1);
  const U exponent = static_cast<U>(kBase + ((r >> M) & U{7}));
  return static_cast<U>((r & kSign) | static_cast<U>(exponent << M) | (r & kMant));
}

template <typename U>
constexpr U raw_lane(U r) {
  return r;
}

constexpr std::uint8_t bool_lane(std::uint8_t r) {
  return r & 1u;
}

template <typename U, U (*Map)(U)>
void fill_lanes(std::byte* out, std::size_t numel, std::uint64_t key) {
  constexpr std::size_t kLanes = 8 / sizeof(U);
  const std::size_t words = numel / kLanes;
  std::uint64_t counter = key;
  for (std::size_t j = 0; j < words; ++j) {
    counter += kGolden;
    const std::uint64_t r = mix64(counter);
    U lanes[kLanes];
    for (std::size_t k = 0; k < kLanes; ++k) {
      lanes[k] = Map(static_cast<U>(r >> (k * 8 * sizeof(U) % 64)));
    }
    std::memcpy(out + j * 8, lanes, 8);
  }
  const std::size_t tail = numel - words * kLanes;
  if (tail > 0) {
    const std::uint64_t r = mix64(counter + kGolden);
    for (std::size_t k = 0; k < tail; ++k) {
      const U lane = Map(static_cast<U>(r >> (k * 8 * sizeof(U) % 64)));
      std::memcpy(out + words * 8 + k * sizeof(U), &lane, sizeof(U));
    }
  }
}

}  // namespace

void fill_tensor(const TensorMeta& meta, std::uint64_t seed, std::uint64_t step,
                 std::span<std::byte> out) {
  const std::size_t bytes = meta.byte_count();
  WC_ENFORCE_EQ(out.size(), bytes, "output size for tensor ", meta.name);
  if (bytes == 0) return;
  const std::uint64_t key =
      mix64(XXH3_64bits_withSeed(meta.name.data(), meta.name.size(), seed) ^ mix64(step));
  const std::size_t n = bytes / element_size(meta.dtype);
  std::byte* p = out.data();
  switch (meta.dtype) {
    case DType::kFloat64:
      return fill_lanes<std::uint64_t, float_lane<std::uint64_t, 52, 1015>>(p, n, key);
    case DType::kFloat32:
      return fill_lanes<std::uint32_t, float_lane<std::uint32_t, 23, 119>>(p, n, key);
    case DType::kBFloat16:
      return fill_lanes<std::uint16_t, float_lane<std::uint16_t, 7, 119>>(p, n, key);
    case DType::kFloat16:
      return fill_lanes<std::uint16_t, float_lane<std::uint16_t, 10, 7>>(p, n, key);
    case DType::kFloat8E4M3Fn:
      return fill_lanes<std::uint8_t, float_lane<std::uint8_t, 3, 1>>(p, n, key);
    case DType::kFloat8E5M2:
      return fill_lanes<std::uint8_t, float_lane<std::uint8_t, 2, 7>>(p, n, key);
    case DType::kInt64:
      return fill_lanes<std::uint64_t, raw_lane<std::uint64_t>>(p, n, key);
    case DType::kInt32:
      return fill_lanes<std::uint32_t, raw_lane<std::uint32_t>>(p, n, key);
    case DType::kInt16:
      return fill_lanes<std::uint16_t, raw_lane<std::uint16_t>>(p, n, key);
    case DType::kInt8:
    case DType::kUInt8:
      return fill_lanes<std::uint8_t, raw_lane<std::uint8_t>>(p, n, key);
    case DType::kBool:
      return fill_lanes<std::uint8_t, bool_lane>(p, n, key);
  }
  WC_ENFORCE(false, "invalid DType value ", static_cast<int>(meta.dtype));
}

}  // namespace weightcast::sync
