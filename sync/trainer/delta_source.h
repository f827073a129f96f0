// DeltaSource: one pipeline stage's memory of what it last sent, from which the next update's
// buckets are sent as deltas (sync/model/delta.h; docs/protocol.md, "Delta buckets").
//
// The source keeps one base copy of its stage: every bucket it sends, delta or full, is copied
// into the base as it is packed (so the base always equals what the engines received), and the
// base is stamped with the update's version once every bucket went out. An update may send
// deltas only against a base whose version every engine confirmed holding (the coordinator
// decides: UpdateSession::delta_base()) and whose bucket plan is the update's plan; then each
// bucket is encoded against its base and sent as a delta when the payload is under
// `max_ratio` of the bucket, else in full. Each delta carries the digest of each tensor's base,
// which the engine checks against what it holds before applying anything. A send that stops
// early leaves the base without a version, so the next update is full.
// Memory: the base is one copy of the stage's buckets (model bytes / pipeline stages, padding
// included), plus one payload buffer per packer slot.
// Lifetime: owned by the updater, one per stage, across updates. Threading: begin()/finish()
// from the sending thread; encode() from the packer thread, one bucket at a time, in order.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/huge_pages.h"
#include "sync/model/bucket.h"
#include "sync/model/delta.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::trainer {

// Whether an updater sends deltas. kAuto (the default) keeps a base per stage and sends a bucket
// as a delta when every engine holds the base and the delta is expected to arrive sooner: the
// source times its full broadcasts (the link) and its encodes, and encodes only while
// 1/encode rate + 1/decode rate + payload ratio/link rate < 0.8/link rate (a delta's CPU work
// and payload against 80% of the full bucket's time on the link), so fast links (loopback,
// NVLink) keep full buckets and slow ones (hosts, WAN) get deltas. The first update keeps no base:
// it is full anyway (no engine holds a base yet) and it measures the link, so a fast link never
// pays for a base. The encoder and decoder are measured once, at construction, on a small
// synthetic slice (8 MiB, 2% of its words changed), and only where deltas pay does the next update
// keep a base (a copy per bucket), so the third update is the first that can send deltas; real
// encodes then refine both rates. Where deltas stop paying the base is dropped (no copy, no
// memory), and should the link become slow enough, the next update keeps one again and the one
// after sends deltas. kAuto keeps measuring: while deltas pay, every kRecheckEvery-th update sends
// its first bucket in full to re-measure the link; while they do not, every kRecheckEvery-th update
// keeps a sample of each bucket (kSampleSlices slices of kSampleSliceBytes, spread over it) and
// the next one encodes the same slices of its buckets against it, which re-measures the payload
// ratio and the encoder on the model's real changes. A re-check sends every bucket in full and
// costs a few MiB per bucket: not a copy of the stage, nor an encode of it. When the decision
// flips, change() says so for the report. kOn keeps a base from the first update and sends a delta
// whenever one is smaller (tests, measurements): deltas from the second update. kOff sends every
// bucket in full and keeps no base.
enum class DeltaMode { kOff, kAuto, kOn };
// "off", "auto" or "on"; anything else throws comm::ConfigError quoting it.
DeltaMode parse_delta_mode(std::string_view text);

// Measures the codec's encode and decode rates on a synthetic slice (8 MiB, a tenth of a second
// on a small virtual machine), once per process: kAuto sources use it from their construction.
// Call at set-up (DistributedUpdater::reserve_buffers() does) to keep it out of the updates.
void prepare_delta_calibration(DeltaCodec codec);

// A delta is sent only when its payload is under this fraction of the bucket: decoding costs the
// engine a pass over the bucket, which a barely smaller payload does not pay back on fast links.
inline constexpr double kDefaultDeltaMaxRatio = 0.75;

// kAuto re-measures what it decided on (the link, or the payload ratio and encoder) this often, in
// updates.
inline constexpr std::uint64_t kRecheckEvery = 4;
// A re-check's sample of a bucket: this many slices of this many bytes (the whole bucket when it
// is no larger).
inline constexpr std::size_t kSampleSlices = 4;
inline constexpr std::size_t kSampleSliceBytes = std::size_t{256} << 10;

class DeltaSource {
 public:
  explicit DeltaSource(DeltaCodec codec = kDefaultDeltaCodec, DeltaMode mode = DeltaMode::kAuto,
                       double max_ratio = kDefaultDeltaMaxRatio);

  // Starts an update that sends `plans`. `delta_base`: the version every engine holds (nullopt:
  // none does, or not all); deltas are made when it is the base's version and the plans are the
  // base's. Returns whether they are.
  bool begin(const std::vector<BucketPlan>& plans, const std::optional<std::string>& delta_base);

  // Bucket k (in order) as packed: copied into the base and, when deltas are made and pay off,
  // encoded into `payload`; returns the request's delta fields then, nullopt to send in full.
  std::optional<BucketDelta> encode(std::uint64_t k, std::span<const std::byte> packed,
                                    std::vector<std::byte>& payload);

  // Ends the update: `version` becomes the base's version when every bucket was sent, else the
  // base has none.
  void finish(bool all_sent, const std::string& version);

  // A full bucket of `bytes` took `seconds` to broadcast: the link's rate, for kAuto. Called from
  // the sending thread while the packer encodes.
  void note_full_broadcast(std::size_t bytes, double seconds);

  const std::optional<std::string>& version() const { return version_; }

  // kAuto: set by begin() when this update's decision differs from the last measured one ("delta
  // auto: deltas now pay (...)" or "... no longer pay (...)", with the rates it was made on);
  // empty otherwise.
  const std::string& change() const { return change_; }

  // Bytes this source keeps between updates: the base, and a re-check's sample.
  std::size_t kept_bytes() const;

 private:
  // kAuto: whether a delta is expected to arrive sooner than the full bucket (false while the link
  // is not measured yet); kOn, kOff: true.
  bool pays() const;
  // Measures the encoder on a synthetic slice, once, before the first real encode.
  void calibrate();
  // change()'s text for a decision that `pay`.
  std::string describe(bool pay) const;
  // kAuto's re-check: samples bucket k (sampling_) and encodes it against the last update's
  // sample (recheck_encode_).
  void sample(std::uint64_t k, std::span<const std::byte> packed);
  // The slices of a bucket of `bytes` that a re-check samples: (offset, length).
  static std::vector<std::pair<std::size_t, std::size_t>> sample_ranges(std::size_t bytes);

  DeltaEncoder encoder_;
  const DeltaMode mode_;
  const double max_ratio_;
  std::atomic<double> link_rate_{0};  // bytes/s of full broadcasts, latest weighted most
  double encode_rate_ = 0;            // bucket bytes/s of encodes
  double decode_rate_ = 0;            // bucket bytes/s of a decode, measured here once
  double payload_ratio_ = 1;          // payload / bucket of recent encodes
  bool keep_base_ = true;             // this update keeps the base up to date
  std::vector<BucketPlan> plans_;
  std::vector<comm::HugePageBytes> buckets_;
  std::optional<std::string> version_;
  std::string base_version_;  // the version this update's deltas are against
  bool deltas_ = false;
  std::uint64_t next_ = 0;
  // kAuto's re-checks (counted in updates, i.e. begin() calls).
  std::uint64_t updates_ = 0;
  std::uint64_t encoded_at_ = 0;  // the last update whose real buckets were encoded
  std::uint64_t linked_at_ = 0;   // the last update with a full broadcast timed
  bool sampling_ = false;         // this update keeps a sample of its buckets to re-measure
  bool recheck_encode_ = false;   // this update encodes its buckets' slices against the sample
  std::uint64_t sampled_at_ = 0;  // the update whose buckets sample_ holds
  std::vector<BucketPlan> sample_plans_;
  std::vector<std::vector<std::byte>> sample_;  // per bucket, its sample_ranges() concatenated
  std::vector<std::byte> sample_payload_;
  bool recheck_link_ = false;    // this update sends bucket 0 in full to re-measure the link
  std::optional<bool> decided_;  // the last decision made on measurements
  std::string change_;
};

}  // namespace weightcast::sync::trainer
