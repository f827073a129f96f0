#include "sync/trainer/delta_source.h"

#include <cstring>

#include "comm/errors.h"
#include "sync/model/checksum.h"

namespace weightcast::sync::trainer {

DeltaMode parse_delta_mode(std::string_view text) {
  if (text == "off") return DeltaMode::kOff;
  if (text == "auto") return DeltaMode::kAuto;
  throw comm::ConfigError("delta mode '" + std::string(text) + "': expected off or auto");
}

DeltaSource::DeltaSource(DeltaCodec codec, double max_ratio)
    : encoder_(codec), max_ratio_(max_ratio) {
  WC_ENFORCE(max_ratio > 0 && max_ratio <= 1, "delta max ratio in (0, 1], got ", max_ratio);
}

bool DeltaSource::begin(const std::vector<BucketPlan>& plans,
                        const std::optional<std::string>& delta_base) {
  deltas_ = delta_base && version_ && *delta_base == *version_ && plans == plans_;
  if (plans != plans_) {
    // A new plan (first update, other tensors or bucket size): a new base, allocated once.
    plans_ = plans;
    buckets_.clear();
    for (const BucketPlan& plan : plans_) {
      buckets_.push_back(std::unique_ptr<std::byte[]>(new std::byte[plan.total_bytes + 1]));
    }
  }
  base_version_ = deltas_ ? *version_ : std::string();
  version_.reset();  // until finish(): a base mid-update is no version's
  next_ = 0;
  return deltas_;
}

std::optional<BucketDelta> DeltaSource::encode(std::uint64_t k, std::span<const std::byte> packed,
                                               std::vector<std::byte>& payload) {
  WC_ENFORCE_EQ(k, next_, "buckets are encoded in order");
  WC_ENFORCE_LT(k, static_cast<std::uint64_t>(plans_.size()));
  const BucketPlan& plan = plans_[k];
  WC_ENFORCE_EQ(packed.size(), plan.total_bytes, "packed bucket ", k);
  next_ = k + 1;
  std::byte* base = buckets_[k].get();
  std::optional<BucketDelta> delta;
  if (deltas_ && plan.total_bytes > 0) {
    const auto limit = static_cast<std::size_t>(max_ratio_ * static_cast<double>(plan.total_bytes));
    if (encoder_.encode(packed, {base, plan.total_bytes}, limit, payload)) {
      delta = BucketDelta{encoder_.codec(), payload.size(), base_version_, {}};
    }
  }
  if (delta) {
    for (const BucketEntry& e : plan.entries) {
      delta->base_digests.push_back(to_string(tensor_digest({base + e.offset, e.bytes})));
    }
  }
  std::memcpy(base, packed.data(), plan.total_bytes);
  return delta;
}

void DeltaSource::finish(bool all_sent, const std::string& version) {
  if (all_sent && next_ == plans_.size()) version_ = version;
  deltas_ = false;
}

std::size_t DeltaSource::base_bytes() const {
  std::size_t sum = 0;
  for (const BucketPlan& plan : plans_) sum += plan.total_bytes;
  return sum;
}

}  // namespace weightcast::sync::trainer
