// Verification of what engines hold after updates: the trainer keeps a mirror of every runner's
// expected per-tensor digests and compares it with the engine's /weights_checksum.
//
// Expectations, computed locally and never read back from the engine:
//   - start: the runner's initial weights — the generator's step-0 bytes of the runner's tensors
//     (target_tensors / draft_tensors of the model spec, with the seed), laid out once with the
//     runner's layout, as the engine's post-load processing does at start;
//   - after each committed update: every sent tensor that the runner's filter accepts, in a
//     runner the session's selector covers, becomes layout(runner)(bytes sent). Anything else
//     stays as it was — so a frozen draft must be bit-identical to its initial weights, and an
//     engine that re-ran post-load processing on it (the double-shuffle bug) is caught.
// Sources compute the digests of what they sent for every layout (sent_digests()), so a
// coordinator can check tensors that other pipeline stages sent.
// Lifetime/threading: plain values; a mirror is used from one thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sync/model/checksum.h"
#include "sync/model/layout.h"
#include "sync/model/model.h"
#include "sync/model/name_filter.h"
#include "sync/protocol/protocol.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/tensors.h"

namespace weightcast::sync::trainer {

// Digests of one sent tensor as each layout leaves it, indexed by static_cast<int>(Layout).
struct SentDigest {
  std::string name;
  std::array<Digest, 2> by_layout;

  bool operator==(const SentDigest&) const = default;
};

// Takes a tensor's NamedTensor::digest, where it has one, as its digest without layout.
std::vector<SentDigest> sent_digests(std::span<const NamedTensor> tensors);

// Text form for shipping between processes; parse_sent_digests(to_text(x)) == x.
std::string to_text(const std::vector<SentDigest>& digests);
std::vector<SentDigest> parse_sent_digests(std::string_view text);

// The differences between the adapter `name` each of `engines` holds (/weights_checksum?lora=)
// and `sent`, the adapter's tensors as sent, at `version`: one line per difference (a digest, a
// missing or unexpected tensor, another version, a failed call), each naming the engine. Empty
// when every engine holds exactly what was sent.
std::vector<std::string> adapter_problems(std::span<EngineApi* const> engines,
                                          const std::string& name, const std::string& version,
                                          const std::vector<SentDigest>& sent);

class RunnerMirror {
 public:
  // `info` as /server_info reports the runner; `spec` and `seed` the generator of its initial
  // weights. Throws comm::BadRequestError for a layout this build does not know, or a filter glob
  // the engine itself would refuse.
  RunnerMirror(const RunnerInfo& info, const ModelSpec& spec, std::uint64_t seed);

  Runner runner() const { return info_.name; }

  // Records a committed update with `selector` that sent `sent`.
  void apply(Selector selector, const std::vector<SentDigest>& sent);

  // One line per difference between the mirror and the engine's answer: a tensor with another
  // digest, a missing one, an unexpected one. Empty when they agree.
  std::vector<std::string> compare(const WeightsChecksumResponse& checksum) const;

 private:
  RunnerInfo info_;
  Layout layout_;
  NameFilter filter_;  // the engine's filter, matched with the engine's code
  std::map<std::string, Digest> expected_;
};

// The mirrors of every runner of every engine, and the check against the engines' answers.
class UpdateVerifier {
 public:
  // `infos[i]` is /server_info of engines[i]; `spec` and `seed` generate the initial weights.
  UpdateVerifier(std::span<EngineApi* const> engines, const std::vector<ServerInfoResponse>& infos,
                 const ModelSpec& spec, std::uint64_t seed);

  // Records a committed update (see RunnerMirror::apply).
  void apply(Selector selector, const std::vector<SentDigest>& sent);

  // Fetches /weights_checksum?recompute=1 of every runner of every engine (digests of the bytes
  // each engine holds now, not the ones it stored at commit), concurrently, and compares.
  // Returns one entry per problem, each naming the engine, runner and tensor (or the failed
  // call, or a weight_version other than `version`); empty when everything matches.
  struct Problem {
    std::optional<Runner> runner;  // unset: the call itself failed
    std::string text;
  };
  std::vector<Problem> check(const std::string& version);
  // As check(), each engine's weight_version expected to be the one its /server_info reported
  // when this verifier was made: after adapter updates, which leave the base weights alone.
  std::vector<Problem> check_unchanged();
  // An adapter update's check (docs/lora.md): every verifiable engine holds adapter `name` at
  // `version` with exactly the digests of `sent` (the adapter's tensors, as sent), no more, no
  // fewer. Problems carry runner target.
  std::vector<Problem> check_adapter(const std::string& name, const std::string& version,
                                     const std::vector<SentDigest>& sent);
  // Engines that serve no /weights_checksum (SGLang ones): not checked, listed here so the
  // caller can say so plainly.
  const std::vector<std::string>& unverifiable() const { return unverifiable_; }

 private:
  std::vector<Problem> check_versions(const std::vector<std::string>& versions);

  std::span<EngineApi* const> engines_;
  std::vector<std::string> versions_;               // [engine]: as /server_info reported it
  std::vector<std::vector<RunnerMirror>> mirrors_;  // [engine][runner]
  std::vector<std::string> unverifiable_;
};

}  // namespace weightcast::sync::trainer
