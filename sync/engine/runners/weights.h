// Initial weights of a runner: generated deterministically from a model spec and seed (the
// trainer runs the same generator, so both sides agree on step-0 weights), or read from a
// safetensors file.
// Lifetime/threading: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sync/engine/runners/runner.h"
#include "sync/model/model.h"

namespace weightcast::sync::engine {

// fill_tensor(meta, seed, step) for each of `metas`.
std::vector<RawTensor> generate_weights(const std::vector<TensorMeta>& metas, std::uint64_t seed,
                                        std::uint64_t step = 0);

// The tensors a runner holds for `spec`: target_tensors() or draft_tensors().
std::vector<TensorMeta> runner_tensors(Runner runner, const ModelSpec& spec);

// Reads a safetensors file (8-byte little-endian header length, JSON header, data). Every size
// is checked against the file before anything is allocated: a header over 100 MiB, a tensor
// outside the data, overlapping tensors, a byte count that disagrees with dtype and shape, or a
// file over `max_bytes` throws comm::ConfigError naming the file and the tensor.
std::vector<RawTensor> load_safetensors(const std::string& path, std::size_t max_bytes);

// Writes `tensors` as a safetensors file (for tools and tests).
void save_safetensors(const std::string& path, const std::vector<RawTensor>& tensors);

}  // namespace weightcast::sync::engine
