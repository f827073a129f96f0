// OpenSession: the Receiver's session (sync/engine/commit/receiver.h) — its one state machine
// (sync/engine/control/session.h) and what the open session holds: the staging its buckets land
// in, the names it was sent (each at most once per session), the colocated copies still running,
// and whether a commit is loading what it staged. The Receiver owns one and calls it under its
// lock; the rules of a session's start, payloads, end and failure live here.
// Errors: refusals throw ReceiverError with the control plane's status.
// Lifetime: owned by the Receiver. Threading: none of its own; the Receiver's lock guards it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "sync/engine/commit/receiver_loader.h"
#include "sync/engine/control/session.h"
#include "sync/engine/lora/adapter_session.h"
#include "sync/engine/stage/staging.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {

// What a commit takes out of the session it ends.
struct SessionTaken {
  Selector selector = Selector::kAll;
  std::optional<std::string> version;  // to publish: the commit's, else the session's pending one
  bool flush = false;
  std::map<Runner, std::map<std::string, StagedTensor>> staged;  // per covered runner
  std::optional<AdapterTarget> adapter;  // an adapter session's: commit builds it, loads nothing
};

class OpenSession {
 public:
  // `distinct`: the ranks stage slices (Staging's distinct staging).
  OpenSession(int ranks, bool distinct) : ranks_(ranks), distinct_(distinct) {}

  SessionMachine& machine() { return machine_; }
  const SessionMachine& machine() const { return machine_; }

  // Opens a session with fresh staging; refused while a commit is still loading. `adapter`: an
  // adapter session (sync/engine/lora/adapter_session.h), selector target only.
  void begin(Selector selector, std::optional<std::string> holder, bool sessionless,
             std::optional<AdapterTarget> adapter = std::nullopt);
  const std::optional<AdapterTarget>& adapter() const { return adapter_; }
  // The session rules a payload meets, in order: a session is open (`token` names it, if given),
  // its selector is the request's (absent: the session's), and `token` may act on it. Returns
  // the selector.
  Selector check_payload(const std::optional<std::string>& token,
                         const std::optional<Selector>& selector, std::string_view route) const;
  // Names sent in this session (each at most once); a payload's are added once it is accepted.
  // `shard_class`: per shard class's group of some of a receiver's ranks (each class is sent every
  // name once, docs/sharding.md); empty: groups of every rank and colocated buckets.
  std::unordered_set<std::string>& names(const std::string& shard_class = {}) {
    return shard_class.empty() ? names_ : class_names_[shard_class];
  }
  const std::shared_ptr<Staging>& staging() const { return staging_; }

  // Ends session `id` without loading anything: staging discarded. False when it is not the open
  // one (already ended).
  bool discard(std::uint64_t id);

  // A colocated bucket's copy starts (its names reserved) and ends; a commit waits for every
  // started one. end_copy() releases the names of a copy that staged nothing, and returns whether
  // the session `id` is still the open one.
  void begin_copy(const std::vector<TensorMeta>& tensors);
  bool copying() const { return copies_ > 0; }
  bool end_copy(std::uint64_t id, const std::vector<TensorMeta>& tensors, bool staged);

  // A commit, in order: check_end() (a session is open, may end, and `token` owns it), the
  // caller's own checks, then take(): refused while a colocated copy runs; takes what each runner
  // the selector covers staged, ends the session, and marks a commit loading until committed()
  // (no session may begin meanwhile).
  void check_end(const std::optional<std::string>& token) const;
  SessionTaken take(const std::vector<ReceiverRunner>& runners,
                    const std::optional<std::string>& version);
  void committed() { committing_ = false; }

 private:
  const int ranks_;
  const bool distinct_;
  SessionMachine machine_;
  std::shared_ptr<Staging> staging_;
  // Names sent in this session (a hash set: every bucket request looks up each of its names).
  std::unordered_set<std::string> names_;
  std::map<std::string, std::unordered_set<std::string>> class_names_;  // by shard class
  std::optional<AdapterTarget> adapter_;  // the adapter an adapter session updates
  int copies_ = 0;                        // colocated buckets being copied
  bool committing_ = false;               // a commit is loading: no new session may begin
};

}  // namespace weightcast::sync::engine
