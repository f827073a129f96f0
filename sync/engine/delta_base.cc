#include "sync/engine/delta_base.h"

#include <algorithm>
#include <cstring>

#include "comm/errors.h"
#include "sync/model/layout.h"

namespace weightcast::sync::engine {

std::optional<std::string> fill_delta_base(const RunnerSet& runners, const BucketPlan& plan,
                                           const std::vector<std::vector<Runner>>& destinations,
                                           const std::vector<Digest>& expected,
                                           const std::string& base_version,
                                           std::span<std::byte> bucket) {
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
    runners.with_tensor(runner, entry.meta.name, [&](const ResidentTensor& t) {
      if (t.bytes.size() != entry.bytes) return;
      resident = true;
      std::memcpy(out.data(), t.bytes.data(), entry.bytes);
      if (t.laid_out) undo_layout(runners.config(runner).layout, t.meta, out);
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

}  // namespace weightcast::sync::engine
