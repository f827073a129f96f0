// ElasticMembers: the engines a DistributedUpdater sends to, and the elastic engine set's engine
// calls (EngineFailurePolicy::kDrop): probing and re-admitting dropped engines, choosing whom to
// drop after a failed attempt. The bookkeeping (membership, epochs, backoff) is EngineSet's; this
// class does the engine calls, each bounded by the probe timeout or the client timeouts, and keeps
// the members' clients in order for the groups and the session.
// Lifetime: owned by its DistributedUpdater, whose engine clients it borrows. Threading: one
// caller at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sync/trainer/engine_api.h"
#include "sync/trainer/engine_set.h"
#include "sync/trainer/report.h"
#include "sync/trainer/session.h"

namespace weightcast::sync::trainer {

class ElasticMembers {
 public:
  // `engines`: every engine, in order; all members at first.
  ElasticMembers(std::span<EngineApi* const> engines, EngineFailurePolicy policy,
                 int max_backoff_updates);

  // Clients with short timeouts for the probes, one per engine (URL engines); without them the
  // probes use the engines' own clients.
  void set_probes(std::vector<std::unique_ptr<EngineApi>> probes) { probes_ = std::move(probes); }
  // Every engine's rank count, from /server_info (connect()); a probe that reads /server_info
  // again updates its engine's.
  void set_rank_counts(std::vector<int> counts) { rank_counts_ = std::move(counts); }
  const std::vector<int>& rank_counts() const { return rank_counts_; }

  // Counts an update (the probes' backoff clock). With kDrop, after `connect` (run only then):
  // probes the dropped engines whose probe is due and re-admits those that answer. Returns their
  // URLs.
  std::vector<std::string> prepare_update(const std::function<void()>& connect);
  // See DistributedUpdater::drop_failed().
  bool drop_failed(UpdateReport& report);
  // The members and epoch a session names (no-op for a session without members).
  void adopt(const UpdateSession& session);
  // Fills report.engines_current and report.out from the set.
  void note_membership(UpdateReport& report) const;
  // Whether engine `e` is a member now.
  bool is_member(std::size_t e) const;
  // After an update committed on every member: those that just became current.
  std::vector<std::size_t> committed() { return set_.committed(); }
  // The session id this updater last had on engine `e` (to abort it, should `e` leave and return).
  void remember_session(std::size_t e, std::string id) { last_ids_[e] = std::move(id); }

  const std::vector<std::size_t>& members() const { return members_; }
  std::span<EngineApi* const> member_ptrs() const { return member_ptrs_; }
  std::uint64_t epoch() const { return epoch_; }
  const EngineSet& engine_set() const { return set_; }

 private:
  void use_members(std::vector<std::size_t> members, std::uint64_t epoch);
  EngineApi& prober(std::size_t engine) const;
  std::vector<char> probe(const std::vector<std::size_t>& engines, bool with_info);
  void readmit(std::size_t engine);

  std::vector<EngineApi*> engines_;
  EngineFailurePolicy policy_;
  EngineSet set_;  // the coordinator decides; every source forms groups of members_
  std::vector<std::size_t> members_;
  std::uint64_t epoch_ = 0;
  std::vector<EngineApi*> member_ptrs_;
  std::vector<std::unique_ptr<EngineApi>> probes_;  // short-timeout clients (URL engines)
  std::vector<std::string> last_ids_;               // per engine: our last session id there
  std::vector<int> rank_counts_;                    // per engine
  int updates_ = 0;                                 // prepare_update() calls: the backoff clock
};

}  // namespace weightcast::sync::trainer
