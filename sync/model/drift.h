// Drift: realistic training steps for the synthetic trainer, for delta updates to be measured on.
//
// fill_tensor() jumps to a step by redrawing the low mantissa bits of every element, so every
// element changes every step: the worst case for a delta. Real RL training keeps fp32 master
// weights, moves each by a small optimizer step (Adam's update is about the learning rate in size
// whatever the gradient) and casts to bf16 for the engines, so only the elements whose master
// crosses a rounding boundary change; public reports put that at 1-3% of elements per step.
// Drift models exactly that: fp32 masters made from the initial bytes (each placed at a
// deterministic point of its value's rounding cell, as an unrounded master would be), each step
// every master moves by lr * u with u uniform in [-1, 1] drawn from (seed, step, element), so
// the same run gives the same bytes on every machine, and the result is rounded to nearest-even
// into the dtype. kRealisticLr is the rate at which the synthetic weights (magnitudes 2^-8 .. 1)
// change 2% of their bf16 elements per step, from the first step on (weightcast-bench codec
// prints the fraction).
// Memory: 4 bytes per element for the masters (twice a bf16 model).
// Lifetime/threading: a Drift owns its masters; one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sync/protocol/dtype.h"

namespace weightcast::sync {

inline constexpr double kRealisticLr = 5e-6;

class Drift {
 public:
  // Masters from `initial` (elements of `dtype`: bfloat16 or float32, else
  // comm::ConfigError). `seed` names the run.
  Drift(DType dtype, std::span<const std::byte> initial, std::uint64_t seed, double lr);

  // One optimizer step (`step` >= 1, each once, in any order), written into `out` (the initial
  // size, else EnforceError). Returns how many elements differ from what `out` held before.
  std::size_t step(std::uint64_t step, std::span<std::byte> out);

  std::size_t elements() const { return masters_.size(); }
  std::size_t bytes() const { return masters_.size() * element_size_; }

 private:
  DType dtype_;
  std::size_t element_size_;
  std::uint64_t seed_;
  float lr_;
  std::vector<float> masters_;
};

// Rounds to the nearest bfloat16, ties to even (NaN stays NaN): the cast a trainer does.
std::uint16_t to_bf16(float value);
float from_bf16(std::uint16_t bits);

}  // namespace weightcast::sync
