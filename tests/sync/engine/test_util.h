// Helpers shared by the engine tests: small tensors with deterministic bytes, the bytes a runner
// must hold after its layout, and one packed bucket.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sync/engine/runners/runner.h"
#include "sync/engine/runners/weights.h"
#include "sync/model/bucket.h"
#include "sync/model/checksum.h"
#include "sync/model/layout.h"
#include "sync/model/model.h"

namespace weightcast::sync::engine::testing {

inline RawTensor tensor(const std::string& name, std::vector<std::int64_t> shape,
                        std::uint64_t step, DType dtype = DType::kBFloat16) {
  TensorMeta meta{name, dtype, std::move(shape)};
  return generate_weights({meta}, /*seed=*/11, step).front();
}

// The resident bytes of `t` in a runner with `layout`.
inline std::vector<std::byte> laid_out(const RawTensor& t, Layout layout) {
  std::vector<std::byte> out = t.bytes;
  apply_layout(layout, t.meta, out);
  return out;
}

inline Digest digest_of(const std::vector<std::byte>& bytes) {
  return tensor_digest(bytes);
}

// Combined digest of what a runner with `layout` must hold for `tensors`.
inline Digest expected_combined(const std::vector<RawTensor>& tensors, Layout layout) {
  std::vector<NamedDigest> entries;
  for (const auto& t : tensors)
    entries.push_back({t.meta.name, tensor_digest(laid_out(t, layout))});
  return combined_digest(std::move(entries));
}

struct PackedBucket {
  BucketPlan plan;
  std::vector<std::byte> bytes;
};

inline PackedBucket pack_bucket(std::uint64_t sequence, const std::vector<RawTensor>& tensors) {
  std::vector<TensorMeta> metas;
  for (const auto& t : tensors) metas.push_back(t.meta);
  PackedBucket out;
  out.plan = make_bucket(sequence, metas);
  out.bytes.resize(out.plan.total_bytes);
  pack(
      out.plan,
      [&](const BucketEntry& e) -> std::span<const std::byte> {
        for (const auto& t : tensors) {
          if (t.meta.name == e.meta.name) return t.bytes;
        }
        return {};
      },
      out.bytes);
  return out;
}

inline std::vector<TensorMeta> metas_of(const std::vector<RawTensor>& tensors) {
  std::vector<TensorMeta> out;
  for (const auto& t : tensors) out.push_back(t.meta);
  return out;
}

}  // namespace weightcast::sync::engine::testing
