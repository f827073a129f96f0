// The commit's loading step: hands staged tensors to a Receiver's runners in layer order, and
// puts the previous version back when a runner's callback throws.
//
// load_staged() calls, per runner that received tensors, `begin`, then `load` once per layer
// (sync/engine/commit/receiver_order.h), then `finish`. When a callback throws, every tensor
// already handed to a runner in this commit is handed again from the kept delta base (the previous
// version's raw bytes, sync/engine/commit/receiver_base.h), so an engine whose `load` writes in
// place returns to its previous weights; without a kept base that is impossible and the error says
// so. Lifetime/threading: free functions over the caller's data; the Receiver serializes commits.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/engine/commit/receiver_base.h"
#include "sync/engine/stage/staging.h"
#include "sync/model/name_filter.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

// A refused or failed Receiver operation, with the status the control plane answers.
class ReceiverError : public comm::Error {
 public:
  ReceiverError(int status, const std::string& what) : comm::Error(what), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

// A runner's `load` or `finish` threw during commit.
class LoadError : public ReceiverError {
 public:
  LoadError(Runner runner, std::string tensor, const std::string& what)
      : ReceiverError(500, what), runner_(runner), tensor_(std::move(tensor)) {}
  Runner runner() const noexcept { return runner_; }
  const std::string& tensor() const noexcept { return tensor_; }

 private:
  Runner runner_;
  std::string tensor_;
};

// Thrown by a `load` callback that knows which tensor of the layer failed (the Python binding
// does); the commit's LoadError then names that tensor instead of the layer's first.
class TensorLoadFailure : public std::runtime_error {
 public:
  TensorLoadFailure(std::string tensor, const std::string& what)
      : std::runtime_error(what), tensor_(std::move(tensor)) {}
  const std::string& tensor() const noexcept { return tensor_; }

 private:
  std::string tensor_;
};

// One tensor handed to `load`: its metadata and its raw bytes (valid during the call only); a
// runner copies what it keeps. (One that keeps the staged pool blocks themselves sets `adopt`.)
struct TensorView {
  const TensorMeta* meta = nullptr;
  std::span<const std::byte> bytes;
};

struct ReceiverRunner {
  Runner id = Runner::kTarget;  // the selector's vocabulary: target or draft
  NameFilter filter;            // incoming names this runner loads
  std::function<void()> begin;  // optional: before its first load of a commit
  std::function<void(std::span<const TensorView>)> load;  // one layer's tensors
  std::function<void()> finish;  // optional: post-load processing, once per commit that loaded
  // Optional: checked for every tensor routed to this runner when its bucket request arrives,
  // before anything is received; a message (what differs from what the runner holds, e.g. dtype
  // or shape) refuses the request with 400 and changes nothing.
  std::function<std::optional<std::string>(const TensorMeta&)> check;
  // Optional, for an in-process runner that keeps what it is handed as it is (RunnerSet): takes a
  // commit's staged tensors for this runner whole (moved: no copy, no layer order) instead of
  // begin, load and finish. It is called once every other runner has loaded and the delta base
  // has recorded the commit, so it must not throw (hand_over() is noexcept).
  std::function<void(std::map<std::string, StagedTensor>&&)> adopt;
  // Optional: the full (unsharded) shape of a weight this runner holds, or none; adapter commits
  // check LoRA shapes against it (sync/engine/lora/adapter_session.h).
  std::function<std::optional<std::vector<std::int64_t>>(const std::string&)> shape_of;
};

// Loads `staged` (per runner: name -> staged tensor) into `runners`; throws LoadError after the
// rollback described above. Runners with `adopt` are only counted here: hand_over() gives them
// their tensors once the commit can no longer fail.
std::vector<RunnerUpdateStats> load_staged(
    const std::vector<ReceiverRunner>& runners,
    const std::map<Runner, std::map<std::string, StagedTensor>>& staged, const ReceiverBase& base);
// Moves each adopting runner's staged tensors out of `staged` into it.
void hand_over(const std::vector<ReceiverRunner>& runners,
               std::map<Runner, std::map<std::string, StagedTensor>>& staged) noexcept;

// One runner's begin, load per layer, finish over `views` (initial weights; no rollback).
void load_views(const ReceiverRunner& runner, const std::vector<TensorView>& views);

}  // namespace weightcast::sync::engine
