// fill_tensor(): a counter-based generator, so any tensor (and any part of it) is computed
// independently of every other, in any order, on any machine.
//
// Two streams per tensor: the base stream, keyed by XXH3-64 of the name (seeded with the run's
// seed), and the step stream, keyed by the base key mixed with the step. Word j of a stream is
// the SplitMix64 finalizer of key + (j + 1) * golden ratio. Each 64-bit word is cut into
// little-endian lanes of the element width, and each lane is mapped to a value of the dtype by
// bit operations only (no float arithmetic, so no rounding-mode or FMA drift), all lanes of a
// word at once.
//
// Training drift: a floating value takes its sign, exponent and top four mantissa bits from the
// base stream and only its low mantissa bits from the step stream, so every step changes the
// bytes of (almost) every element but moves a value by less than 2^-4 of itself, as a small
// learning rate would. Integer and bool tensors come from the step stream alone.
//
// The frozen EAGLE head's draft.fc.weight ([h, 2h]) is a near-identity on its first h columns:
// 1.0 on the diagonal and every other value scaled down by 2^-6. A draft distilled from its
// target passes the token embedding through almost unchanged; that is what gives the
// speculative accept-length probe (sync/model/spec_probe.h) a real signal, and what a wrong layout
// of the draft destroys.
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <tuple>

#include "comm/errors.h"
#include "sync/model/model.h"

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

// `lane` repeated across a 64-bit word of sizeof(U)-byte lanes.
template <typename U>
constexpr std::uint64_t repeat(U lane) {
  std::uint64_t out = 0;
  for (std::size_t k = 0; k < 8 / sizeof(U); ++k) {
    out |= static_cast<std::uint64_t>(lane) << (k * 8 * sizeof(U) % 64);
  }
  return out;
}

// A floating type of lane U with M mantissa bits, for all lanes of a word at once: keep sign and
// mantissa from the random bits, make the biased exponent kBase + 3 random bits. kBase and
// kBase + 7 are normal, finite exponents, and no step carries into the next lane.
template <typename U, int M, U kBase>
constexpr std::uint64_t float_word(std::uint64_t r) {
  constexpr U kSign = static_cast<U>(U{1} << (8 * sizeof(U) - 1));
  constexpr U kMant = static_cast<U>((U{1} << M) - 1);
  constexpr std::uint64_t kKeep = repeat<U>(static_cast<U>(kSign | kMant));
  return (r & kKeep) | ((((r >> M) & repeat<U>(7)) + repeat<U>(kBase)) << M);
}

constexpr std::uint64_t raw_word(std::uint64_t r) {
  return r;
}
constexpr std::uint64_t bool_word(std::uint64_t r) {
  return r & repeat<std::uint8_t>(1);
}

// Low mantissa bits of every lane that the step stream supplies: all but the top four mantissa
// bits (at least one bit for the 8-bit floats).
template <typename U, int M>
constexpr std::uint64_t drift_mask() {
  constexpr int kBits = M > 5 ? M - 4 : 1;
  return repeat<U>(static_cast<U>((U{1} << kBits) - 1));
}

// Word j of a stream fills bytes [8j, 8j + 8); the last word may be cut short. `drift` selects
// the bits taken from the step stream (all of them when it is ~0).
template <std::uint64_t (*Map)(std::uint64_t)>
void fill_words(std::byte* out, std::size_t bytes, std::uint64_t base_key, std::uint64_t step_key,
                std::uint64_t drift) {
  const std::size_t words = (bytes + 7) / 8;
  std::uint64_t base = base_key;
  std::uint64_t step = step_key;
  for (std::size_t j = 0; j < words; ++j) {
    base += kGolden;
    step += kGolden;
    const std::uint64_t b = drift == ~0ull ? 0 : Map(mix64(base));
    const std::uint64_t w = (b & ~drift) | (Map(mix64(step)) & drift);
    // whole lanes: bytes is a multiple of the element width
    std::memcpy(out + j * 8, &w, std::min<std::size_t>(8, bytes - j * 8));
  }
}

// A floating dtype's bits: lane type U, M mantissa bits, exponent bias kBias, and kFillBase, the
// lowest biased exponent float_word gives it (kFillBase + 7 stays normal and finite).
template <DType D, typename U, int M, int kBias, U kFillBase>
struct FloatFormat {
  static constexpr DType kDType = D;
  using Lane = U;
  static constexpr int kMantissa = M;
  static constexpr int kExponentBias = kBias;
  static constexpr U kBase = kFillBase;
};

using FloatFormats = std::tuple<FloatFormat<DType::kFloat64, std::uint64_t, 52, 1023, 1015>,
                                FloatFormat<DType::kFloat32, std::uint32_t, 23, 127, 119>,
                                FloatFormat<DType::kBFloat16, std::uint16_t, 7, 127, 119>,
                                FloatFormat<DType::kFloat16, std::uint16_t, 10, 15, 7>,
                                FloatFormat<DType::kFloat8E4M3Fn, std::uint8_t, 3, 7, 1>,
                                FloatFormat<DType::kFloat8E5M2, std::uint8_t, 2, 15, 7>>;

// Calls `f(FloatFormat{})` with the format of `dtype`; false (and no call) for a non-float dtype.
template <typename F>
bool with_float_format(DType dtype, F&& f) {
  return std::apply(
      [&](auto... format) { return ((format.kDType == dtype && (f(format), true)) || ...); },
      FloatFormats{});
}

template <typename F>
void fill_float(std::byte* out, std::size_t bytes, std::uint64_t base_key, std::uint64_t step_key) {
  using U = typename F::Lane;
  fill_words<float_word<U, F::kMantissa, F::kBase>>(out, bytes, base_key, step_key,
                                                    drift_mask<U, F::kMantissa>());
}

// See the file comment: 1.0 on the diagonal of the first h columns, the rest divided by 2^6
// (an exponent decrement, exact and still normal for every exponent float_word produces).
template <typename F>
void make_near_identity(std::byte* out, std::int64_t rows, std::int64_t cols) {
  using U = typename F::Lane;
  constexpr int M = F::kMantissa;
  constexpr U kExpMask = static_cast<U>(((U{1} << (8 * sizeof(U) - 1)) - 1) & ~((U{1} << M) - 1));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      U v;
      std::byte* at = out + (r * cols + c) * static_cast<std::int64_t>(sizeof(U));
      std::memcpy(&v, at, sizeof(U));
      if (r == c) {
        v = static_cast<U>(U{F::kExponentBias} << M);
      } else {
        v = static_cast<U>((v & ~kExpMask) | ((v & kExpMask) - (U{6} << M)));
      }
      std::memcpy(at, &v, sizeof(U));
    }
  }
}

// Integer and bool tensors: the step stream alone.
void fill_integer(DType dtype, std::byte* out, std::size_t bytes, std::uint64_t step_key) {
  switch (dtype) {
    case DType::kInt64:
    case DType::kInt32:
    case DType::kInt16:
    case DType::kInt8:
    case DType::kUInt8:
      return fill_words<raw_word>(out, bytes, 0, step_key, ~0ull);
    case DType::kBool:
      return fill_words<bool_word>(out, bytes, 0, step_key, ~0ull);
    default:
      WC_ENFORCE(false, "invalid DType value ", static_cast<int>(dtype));
  }
}

void structure_draft_fc(const TensorMeta& meta, std::byte* out) {
  if (meta.name != std::string(kDraftPrefix) + "fc.weight" || meta.shape.size() != 2) return;
  const auto rows = meta.shape[0], cols = meta.shape[1];
  with_float_format(meta.dtype, [&](auto format) {
    // 8-bit floats (like integers) keep the plain random fill.
    if constexpr (sizeof(typename decltype(format)::Lane) > 1) {
      make_near_identity<decltype(format)>(out, rows, cols);
    }
  });
}

}  // namespace

void fill_tensor(const TensorMeta& meta, std::uint64_t seed, std::uint64_t step,
                 std::span<std::byte> out) {
  const std::size_t bytes = meta.byte_count();
  WC_ENFORCE_EQ(out.size(), bytes, "output size for tensor ", meta.name);
  if (bytes == 0) return;
  const std::uint64_t base_key =
      mix64(XXH3_64bits_withSeed(meta.name.data(), meta.name.size(), seed));
  const std::uint64_t step_key = mix64(base_key ^ mix64(step + 1));
  std::byte* p = out.data();
  const bool is_float = with_float_format(
      meta.dtype, [&](auto format) { fill_float<decltype(format)>(p, bytes, base_key, step_key); });
  if (!is_float) fill_integer(meta.dtype, p, bytes, step_key);
  structure_draft_fc(meta, p);
}

}  // namespace weightcast::sync
