#include "sync/trainer/delta_source.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "comm/deadline.h"
#include "comm/errors.h"
#include "sync/model/checksum.h"

namespace weightcast::sync::trainer {

DeltaMode parse_delta_mode(std::string_view text) {
  if (text == "off") return DeltaMode::kOff;
  if (text == "auto") return DeltaMode::kAuto;
  if (text == "on") return DeltaMode::kOn;
  throw comm::ConfigError("delta mode '" + std::string(text) + "': expected off, auto or on");
}

DeltaSource::DeltaSource(DeltaCodec codec, DeltaMode mode, double max_ratio)
    : encoder_(codec), mode_(mode), max_ratio_(max_ratio) {
  WC_ENFORCE(max_ratio > 0 && max_ratio <= 1, "delta max ratio in (0, 1], got ", max_ratio);
  // Ahead of the updates (prepare_delta_calibration() at set-up measures it before the first):
  // measured inside the second update, it cost that update a tenth of a second (fresh pages for
  // the synthetic slice on a virtual machine), docs/performance.md.
  if (mode_ == DeltaMode::kAuto) calibrate();
}

bool DeltaSource::begin(const std::vector<BucketPlan>& plans,
                        const std::optional<std::string>& delta_base) {
  ++updates_;
  change_.clear();
  const bool pay = pays();
  recheck_link_ = false;
  // A sample taken by the previous update, of this update's plan, is encoded by this one.
  recheck_encode_ = !sample_.empty() && sampled_at_ + 1 == updates_ && plans == sample_plans_;
  sampling_ = false;
  if (mode_ == DeltaMode::kAuto && link_rate_.load() > 0) {
    if (decided_ && *decided_ != pay) change_ = describe(pay);
    decided_ = pay;
    // Keep learning: what the decision rests on is measured again every few updates.
    sampling_ = !pay && !recheck_encode_ && updates_ - encoded_at_ >= kRecheckEvery;
    recheck_link_ = pay && updates_ - linked_at_ >= kRecheckEvery;
  }
  if (!recheck_encode_ && !sampling_) {
    sample_.clear();
    sample_plans_.clear();
  }
  keep_base_ = pay;
  deltas_ = keep_base_ && delta_base && version_ && *delta_base == *version_ && plans == plans_ &&
            !buckets_.empty();
  if (!keep_base_) {
    // kAuto on a link faster than the encoder: no base is kept (no copy per bucket, no memory).
    buckets_.clear();
    plans_.clear();
    version_.reset();
    next_ = 0;
    if (sampling_) {
      sample_plans_ = plans;
      sample_.assign(plans.size(), {});
    }
    return false;
  }
  if (plans != plans_ || buckets_.empty()) {
    // A new plan (first update, other tensors or bucket size): a new base, allocated once, in
    // huge pages (written once now: fresh small pages cost the first copy a fault per 4 KiB).
    plans_ = plans;
    buckets_.clear();
    for (const BucketPlan& plan : plans_) buckets_.emplace_back(plan.total_bytes + 1);
  }
  base_version_ = deltas_ ? *version_ : std::string();
  version_.reset();  // until finish(): a base mid-update is no version's
  next_ = 0;
  return deltas_;
}

std::vector<std::pair<std::size_t, std::size_t>> DeltaSource::sample_ranges(std::size_t bytes) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if (bytes <= kSampleSlices * kSampleSliceBytes) {
    if (bytes > 0) out.emplace_back(0, bytes);
    return out;
  }
  for (std::size_t i = 0; i < kSampleSlices; ++i) {
    out.emplace_back(i * (bytes / kSampleSlices), kSampleSliceBytes);
  }
  return out;
}

void DeltaSource::sample(std::uint64_t k, std::span<const std::byte> packed) {
  const auto ranges = sample_ranges(packed.size());
  std::vector<std::byte>& kept = sample_[k];
  if (recheck_encode_ && !kept.empty()) {
    // Encode this update's slices against the last one's: the payload ratio and encoder rate on
    // the model's real changes, at the cost of a few MiB per bucket.
    std::size_t at = 0;
    std::size_t bytes = 0;
    std::size_t payload_bytes = 0;
    double seconds = 0;
    for (const auto& [offset, len] : ranges) {
      const auto start = comm::Clock::now();
      const bool encoded = encoder_.encode(packed.subspan(offset, len), {kept.data() + at, len},
                                           len, sample_payload_);
      seconds += comm::seconds_since(start);
      payload_bytes += encoded ? sample_payload_.size() : len;
      bytes += len;
      at += len;
    }
    if (bytes > 0) {
      const double rate = static_cast<double>(bytes) / std::max(seconds, 1e-9);
      encode_rate_ = encode_rate_ > 0 ? 0.5 * (encode_rate_ + rate) : rate;
      payload_ratio_ =
          0.5 * (payload_ratio_ + static_cast<double>(payload_bytes) / static_cast<double>(bytes));
      encoded_at_ = updates_;
    }
  }
  if (!sampling_) return;
  kept.clear();
  for (const auto& [offset, len] : ranges) {
    kept.insert(kept.end(), packed.begin() + static_cast<std::ptrdiff_t>(offset),
                packed.begin() + static_cast<std::ptrdiff_t>(offset + len));
  }
}

std::optional<BucketDelta> DeltaSource::encode(std::uint64_t k, std::span<const std::byte> packed,
                                               std::vector<std::byte>& payload) {
  WC_ENFORCE_EQ(k, next_, "buckets are encoded in order");
  if (!keep_base_) {
    if ((sampling_ || recheck_encode_) && k < sample_.size()) sample(k, packed);
    next_ = k + 1;
    return std::nullopt;
  }
  WC_ENFORCE_LT(k, static_cast<std::uint64_t>(plans_.size()));
  const BucketPlan& plan = plans_[k];
  WC_ENFORCE_EQ(packed.size(), plan.total_bytes, "packed bucket ", k);
  next_ = k + 1;
  std::byte* base = buckets_[k].data();
  std::optional<BucketDelta> delta;
  const bool relink = recheck_link_ && k == 0;  // full, so the link is timed again
  if (deltas_ && plan.total_bytes > 0 && !relink && pays()) {
    encoded_at_ = updates_;
    const auto limit = static_cast<std::size_t>(max_ratio_ * static_cast<double>(plan.total_bytes));
    const auto start = comm::Clock::now();
    const bool encoded = encoder_.encode(packed, {base, plan.total_bytes}, limit, payload);
    const double seconds = comm::seconds_since(start);
    const double bytes = static_cast<double>(plan.total_bytes);
    const double rate = bytes / std::max(seconds, 1e-9);
    const double ratio = encoded ? static_cast<double>(payload.size()) / bytes : 1.0;
    encode_rate_ = encode_rate_ > 0 ? 0.5 * (encode_rate_ + rate) : rate;
    payload_ratio_ = 0.5 * (payload_ratio_ + ratio);
    // What it made is sent only where deltas still pay on the new measurement.
    if (encoded && pays()) {
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

bool DeltaSource::pays() const {
  if (mode_ != DeltaMode::kAuto) return true;
  const double link = link_rate_.load();
  // Nothing measured yet (the first update): no base, and the full broadcasts measure the link.
  if (link <= 0 || encode_rate_ <= 0 || decode_rate_ <= 0) return false;
  // Time of a delta (encode, its payload on the link, the engines' decode) against the full
  // bucket on the link, with a margin: near the crossover a delta's CPU work competes with the
  // data plane (on one host it is the data plane), so a wrong guess for deltas costs more than a
  // wrong guess for full buckets, which forgoes at most the margin.
  constexpr double kMargin = 0.8;
  return 1.0 / encode_rate_ + 1.0 / decode_rate_ + payload_ratio_ / link < kMargin / link;
}

namespace {

// The codec's rates on a synthetic slice, measured once per process and codec: they describe
// the machine, not a stage, so every stage's source shares them.
struct Calibration {
  double encode_rate = 0;
  double decode_rate = 0;
  double payload_ratio = 1;
};

Calibration measure(DeltaCodec codec) {
  constexpr std::size_t kBytes = std::size_t{8} << 20;
  std::vector<std::byte> base(kBytes);
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (std::size_t i = 0; i < kBytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(base.data() + i, &x, 8);
  }
  std::vector<std::byte> next = base;
  for (std::size_t w = 0; w < kBytes / 2; w += 50) next[2 * w] ^= std::byte{1};  // 2% of words
  std::vector<std::byte> payload;
  DeltaEncoder encoder(codec);
  Calibration c;
  const auto start = comm::Clock::now();
  const bool encoded = encoder.encode(next, base, kBytes, payload);
  c.encode_rate = static_cast<double>(kBytes) / std::max(comm::seconds_since(start), 1e-9);
  c.payload_ratio = encoded ? static_cast<double>(payload.size()) / kBytes : 1.0;
  // The engines run the same decoder: its rate here stands for theirs (rebuilding and hashing the
  // base costs them about as much again, which the margin in pays() covers).
  c.decode_rate = c.encode_rate;
  if (encoded) {
    DeltaDecoder decoder(codec);
    const auto decode_start = comm::Clock::now();
    decoder.decode(payload, base);
    c.decode_rate = static_cast<double>(kBytes) / std::max(comm::seconds_since(decode_start), 1e-9);
  }
  return c;
}

Calibration calibration(DeltaCodec codec) {
  static std::mutex mu;
  static std::map<DeltaCodec, Calibration> measured;
  std::lock_guard lock(mu);
  auto it = measured.find(codec);
  if (it == measured.end()) it = measured.emplace(codec, measure(codec)).first;
  return it->second;
}

}  // namespace

void prepare_delta_calibration(DeltaCodec codec) {
  calibration(codec);
}

void DeltaSource::calibrate() {
  const Calibration c = calibration(encoder_.codec());
  encode_rate_ = c.encode_rate;
  decode_rate_ = c.decode_rate;
  payload_ratio_ = c.payload_ratio;
}

std::string DeltaSource::describe(bool pay) const {
  const auto rate = [](double bytes_per_s) {
    return std::to_string(bytes_per_s / 1e9).substr(0, 5) + " GB/s";
  };
  return std::string("delta auto: deltas ") + (pay ? "now pay" : "no longer pay") + " (payload " +
         std::to_string(payload_ratio_).substr(0, 5) + " of a bucket, link " +
         rate(link_rate_.load()) + ", encode " + rate(encode_rate_) + ", decode " +
         rate(decode_rate_) + ")";
}

void DeltaSource::note_full_broadcast(std::size_t bytes, double seconds) {
  if (bytes == 0 || seconds <= 0) return;
  linked_at_ = updates_;
  const double rate = static_cast<double>(bytes) / seconds;
  const double old = link_rate_.load();
  link_rate_.store(old > 0 ? 0.5 * (old + rate) : rate);
}

std::size_t DeltaSource::kept_bytes() const {
  std::size_t n = 0;
  for (const auto& b : buckets_) n += b.size();
  for (const auto& b : sample_) n += b.size();
  return n;
}

void DeltaSource::finish(bool all_sent, const std::string& version) {
  if (keep_base_ && all_sent && next_ == plans_.size()) version_ = version;
  if (sampling_ && all_sent && next_ == sample_plans_.size()) {
    sampled_at_ = updates_;
  } else {
    sample_.clear();  // encoded, or not a whole update's: either way of no further use
    sample_plans_.clear();
  }
  deltas_ = false;
}

}  // namespace weightcast::sync::trainer
