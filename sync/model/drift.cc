#include "sync/model/drift.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "comm/errors.h"

namespace weightcast::sync {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Four draws of u in [-1, 1) from one 64-bit hash of (seed, step, element / 4).
void draws(std::uint64_t key, float u[4]) {
  const std::uint64_t bits = splitmix64(key);
  for (int i = 0; i < 4; ++i) {
    const auto v = static_cast<std::uint16_t>(bits >> (16 * i));
    u[i] = static_cast<float>(v) * (2.0f / 65536.0f) - 1.0f;
  }
}

}  // namespace

std::uint16_t to_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float from_bf16(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

Drift::Drift(DType dtype, std::span<const std::byte> initial, std::uint64_t seed, double lr)
    : dtype_(dtype), seed_(seed), lr_(static_cast<float>(lr)) {
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat32) {
    throw comm::ConfigError("drift: weights of dtype " + std::string(to_string(dtype)) +
                            " cannot drift (bfloat16 or float32 only)");
  }
  element_size_ = dtype == DType::kBFloat16 ? 2 : 4;
  WC_ENFORCE_EQ(initial.size() % element_size_, std::size_t{0}, "drift: whole elements");
  masters_.resize(initial.size() / element_size_);
  // A trainer's fp32 master is not on the bf16 grid: it is the unrounded value. Each master starts
  // somewhere in its value's rounding cell (a deterministic offset of under half a bf16 step), so
  // the first step already changes what a steady run changes.
  const std::uint64_t key = splitmix64(seed_ ^ 0x6a09e667f3bcc909ULL);
  float u[4];
  for (std::size_t i = 0; i < masters_.size(); ++i) {
    if (element_size_ == 2) {
      std::uint16_t b;
      std::memcpy(&b, initial.data() + 2 * i, 2);
      const float value = from_bf16(b);
      if (i % 4 == 0) draws(key + i / 4, u);
      const float next = from_bf16(static_cast<std::uint16_t>(b + 1));
      const float half_step = 0.499f * std::fabs(next - value);
      const float master = value + u[i % 4] * half_step;
      masters_[i] = std::isfinite(master) && to_bf16(master) == b ? master : value;
    } else {
      std::memcpy(&masters_[i], initial.data() + 4 * i, 4);
    }
  }
}

std::size_t Drift::step(std::uint64_t step, std::span<std::byte> out) {
  WC_ENFORCE_EQ(out.size(), bytes(), "drift: output size");
  WC_ENFORCE_GE(step, std::uint64_t{1});
  const std::uint64_t key = splitmix64(seed_ ^ splitmix64(step));
  std::size_t changed = 0;
  float u[4];
  for (std::size_t i = 0; i < masters_.size(); ++i) {
    if (i % 4 == 0) draws(key + i / 4, u);
    masters_[i] += lr_ * u[i % 4];
    if (element_size_ == 2) {
      const std::uint16_t b = to_bf16(masters_[i]);
      std::uint16_t old;
      std::memcpy(&old, out.data() + 2 * i, 2);
      changed += old != b;
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else {
      std::uint32_t old;
      std::memcpy(&old, out.data() + 4 * i, 4);
      changed += old != std::bit_cast<std::uint32_t>(masters_[i]);
      std::memcpy(out.data() + 4 * i, &masters_[i], 4);
    }
  }
  return changed;
}

}  // namespace weightcast::sync
