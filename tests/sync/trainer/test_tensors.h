// Random named tensors for the trainer's unit tests (deterministic per seed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sync/trainer/tensors.h"

namespace weightcast::sync::trainer::testing {

// `count` tensors named "t<i>" with random dtypes, shapes of up to `max_elements` elements
// (some empty) and random bytes.
inline std::vector<HostTensor> random_tensors(std::uint32_t seed, int count,
                                              std::int64_t max_elements) {
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8, DType::kFloat64};
  std::vector<HostTensor> out;
  for (int i = 0; i < count; ++i) {
    HostTensor t;
    t.meta.name = "layer." + std::to_string(i) + ".w";
    t.meta.dtype = dtypes[rng() % 4];
    const std::int64_t elements = static_cast<std::int64_t>(rng() % (max_elements + 1));
    if (rng() % 2 == 0 && elements % 4 == 0) {
      t.meta.shape = {4, elements / 4};
    } else {
      t.meta.shape = {elements};
    }
    t.bytes.resize(t.meta.byte_count());
    for (auto& b : t.bytes) b = static_cast<std::byte>(rng() & 0xff);
    out.push_back(std::move(t));
  }
  return out;
}

// The tensors as FakeEngine::committed() lists them: name -> bytes.
inline std::map<std::string, std::vector<std::byte>> as_map(
    const std::vector<HostTensor>& tensors) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& t : tensors) out[t.meta.name] = t.bytes;
  return out;
}

}  // namespace weightcast::sync::trainer::testing
