#include "sync/engine/runners/delta_base.h"

#include <algorithm>
#include <cstring>

#include "comm/errors.h"
#include "sync/model/layout.h"

namespace weightcast::sync::engine {

std::optional<std::string> fill_delta_base(const RunnerSet& runners, const BucketPlan& plan,
                                           const std::vector<std::vector<Runner>>& destinations,
                                           const std::vector<Digest>& expected,
                                           const std::string& base_version,
                                           std::span<std::byte> bucket, const ShardPlan* slices) {
  WC_ENFORCE_EQ(bucket.size(), plan.total_bytes, "delta base buffer");
  WC_ENFORCE_EQ(destinations.size(), plan.entries.size());
  WC_ENFORCE_EQ(expected.size(), plan.entries.size());
  const std::string version = runners.weight_version();
  // Only what no tensor below overwrites is zeroed: padding, and tensors no runner takes.
  std::size_t written = 0;
  const auto zero_to = [&](std::size_t end) {
    if (end > written) std::memset(bucket.data() + written, 0, end - written);
    written = std::max(written, end);
  };
  for (std::size_t i = 0; i < plan.entries.size(); ++i) {
    const BucketEntry& entry = plan.entries[i];
    if (destinations[i].empty() || entry.bytes == 0) continue;
    zero_to(entry.offset);
    written = entry.offset + entry.bytes;
    const Runner runner = destinations[i].front();
    const auto out = bucket.subspan(entry.offset, entry.bytes);
    bool resident = false;
    const TensorSlice* slice = slices != nullptr ? slices->find(entry.meta.name) : nullptr;
    runners.with_tensor(runner, entry.meta.name, [&](const ResidentTensor& t) {
      if (t.bytes.size() == entry.bytes) {
        resident = true;
        std::memcpy(out.data(), t.bytes.data(), entry.bytes);
        if (t.laid_out) undo_layout(runners.config(runner).layout, t.meta, out);
        return;
      }
      // A shard class's slice of the tensor: cut from the raw bytes (the layout undone first).
      if (slice == nullptr || slice->kind != TensorSlice::Kind::kSlice ||
          sliced_bytes(t.meta, *slice) != entry.bytes) {
        return;
      }
      resident = true;
      if (!t.laid_out) {
        pack_slice(t.meta, *slice, t.bytes, out);
        return;
      }
      std::vector<std::byte> raw(t.bytes.begin(), t.bytes.end());
      undo_layout(runners.config(runner).layout, t.meta, raw);
      pack_slice(t.meta, *slice, raw, out);
    });
    // Built only for a refusal: the happy path stays free of string work.
    const auto where = [&] {
      return "delta base of tensor '" + entry.meta.name + "' in runner '" +
             std::string(to_string(runner)) + "'";
    };
    if (!resident) {
      return where() + ": not resident with " + std::to_string(entry.bytes) +
             " bytes at weight_version '" + version + "' (the delta's base_version is '" +
             base_version + "'); send the bucket in full";
    }
    const Digest held = tensor_digest(out);
    if (held != expected[i]) {
      return where() + ": the engine holds digest " + to_string(held) + " at weight_version '" +
             version + "', the delta was computed against digest " + to_string(expected[i]) +
             " at base_version '" + base_version + "'; send the bucket in full";
    }
  }
  zero_to(bucket.size());
  return std::nullopt;
}

std::variant<Refusal, std::shared_ptr<const DeltaSpec>> make_delta_spec(
    const BucketDelta& delta, const std::string& held_version, bool has_base,
    std::size_t max_wire_bytes, DeltaBaseSource source, const ShardPlan* slices) {
  if (delta.base_version != held_version || !has_base) {
    return Refusal{409, "delta.base_version: the delta is against weight_version '" +
                            delta.base_version + "' but this engine holds '" + held_version +
                            (has_base ? "'" : "' with no delta base kept") +
                            "; send the bucket in full"};
  }
  if (delta.wire_bytes > max_wire_bytes) {
    return Refusal{400, "delta.wire_bytes: " + std::to_string(delta.wire_bytes) +
                            " over --max-bucket-bytes = " + std::to_string(max_wire_bytes)};
  }
  std::vector<Digest> expected;
  try {
    for (const auto& d : delta.base_digests) {
      expected.push_back(parse_digest(d, "delta.base_digests"));
    }
  } catch (const comm::BadRequestError& e) {
    return Refusal{400, e.what()};
  }
  auto spec = std::make_shared<DeltaSpec>();
  spec->codec = delta.codec;
  spec->wire_bytes = delta.wire_bytes;
  spec->fill_base = [source = std::move(source), expected = std::move(expected),
                     base = delta.base_version,
                     slices](const BucketPlan& plan, const std::vector<std::vector<Runner>>& dest,
                             std::span<std::byte> bucket) {
    return source(plan, dest, expected, base, bucket, slices);
  };
  return std::shared_ptr<const DeltaSpec>(std::move(spec));
}

}  // namespace weightcast::sync::engine
