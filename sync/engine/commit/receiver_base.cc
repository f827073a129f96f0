#include "sync/engine/commit/receiver_base.h"

#include <algorithm>
#include <cstring>

#include "comm/errors.h"

namespace weightcast::sync::engine {

void ReceiverBase::set_keep_bytes(bool keep) {
  keep_bytes_ = keep;
  if (!keep) {
    base_.clear();
    bytes_ = 0;
  }
}

void ReceiverBase::record(Runner runner, const TensorMeta& meta, const SharedBytes& bytes,
                          const Digest& digest) {
  digests_[static_cast<int>(runner)][meta.name] = digest;
  if (!keep_bytes_) return;
  auto& slot = base_[meta.name];
  bytes_ -= slot.bytes.size();
  slot = {meta, bytes};
  bytes_ += slot.bytes.size();
}

const ReceiverBase::Tensor* ReceiverBase::base_of(std::string_view name) const {
  auto it = base_.find(name);
  return it == base_.end() ? nullptr : &it->second;
}

std::optional<std::string> ReceiverBase::fill(const BucketPlan& plan,
                                              const std::vector<std::vector<Runner>>& destinations,
                                              const std::vector<Digest>& expected,
                                              std::span<std::byte> bucket) const {
  WC_ENFORCE_EQ(bucket.size(), plan.total_bytes, "delta base buffer");
  WC_ENFORCE_EQ(destinations.size(), plan.entries.size());
  WC_ENFORCE_EQ(expected.size(), plan.entries.size());
  std::memset(bucket.data(), 0, bucket.size());
  for (std::size_t i = 0; i < plan.entries.size(); ++i) {
    const BucketEntry& entry = plan.entries[i];
    if (destinations[i].empty() || entry.bytes == 0) continue;
    const Tensor* held = base_of(entry.meta.name);
    if (!held || held->bytes.size() != entry.bytes) {
      return "delta base of tensor '" + entry.meta.name +
             "': this receiver holds no base of it; send the bucket in full";
    }
    std::memcpy(bucket.data() + entry.offset, held->bytes.data(), entry.bytes);
    const Digest digest = tensor_digest(bucket.subspan(entry.offset, entry.bytes));
    if (digest != expected[i]) {
      return "delta base of tensor '" + entry.meta.name + "': the receiver holds digest " +
             to_string(digest) + ", the delta was computed against " + to_string(expected[i]) +
             "; send the bucket in full";
    }
  }
  return std::nullopt;
}

const std::map<std::string, Digest>& ReceiverBase::digests(Runner runner) const {
  return digests_[static_cast<int>(runner)];
}

std::string ReceiverBase::held_digest(Selector selector) const {
  if (!has_base()) return "";
  std::vector<NamedDigest> covered;
  for (Runner id : kAllRunners) {
    if (!covers(selector, id)) continue;
    CombinedHasher tensors;  // the map is in name order
    for (const auto& [name, digest] : digests(id)) tensors.add(name, digest);
    covered.push_back({std::string(to_string(id)), tensors.digest()});
  }
  return to_string(combined_digest(std::move(covered)));
}

}  // namespace weightcast::sync::engine
