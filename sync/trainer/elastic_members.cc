#include "sync/trainer/elastic_members.h"

#include <algorithm>

#include "comm/errors.h"
#include "sync/trainer/engine_calls.h"

namespace weightcast::sync::trainer {

ElasticMembers::ElasticMembers(std::span<EngineApi* const> engines, EngineFailurePolicy policy,
                               int max_backoff_updates)
    : engines_(engines.begin(), engines.end()),
      policy_(policy),
      set_(engines_.size(), max_backoff_updates),
      last_ids_(engines_.size()) {
  use_members(set_.members(), set_.epoch());
}

void ElasticMembers::use_members(std::vector<std::size_t> members, std::uint64_t epoch) {
  for (std::size_t e : members) WC_ENFORCE_LT(e, engines_.size(), "session member");
  members_ = std::move(members);
  epoch_ = epoch;
  member_ptrs_.clear();
  for (std::size_t e : members_) member_ptrs_.push_back(engines_[e]);
}

void ElasticMembers::adopt(const UpdateSession& session) {
  if (session.members().empty()) return;
  use_members(session.members(), session.epoch());
}

bool ElasticMembers::is_member(std::size_t e) const {
  return std::find(members_.begin(), members_.end(), e) != members_.end();
}

EngineApi& ElasticMembers::prober(std::size_t engine) const {
  return probes_.empty() ? *engines_[engine] : *probes_[engine];
}

// Asks /health (and, with_info, /server_info) of `engines` concurrently, each bounded by the
// probe clients' timeouts. Returns per engine whether it answered.
std::vector<char> ElasticMembers::probe(const std::vector<std::size_t>& engines, bool with_info) {
  std::vector<EngineApi*> targets;
  for (std::size_t e : engines) targets.push_back(&prober(e));
  std::vector<ServerInfoResponse> infos(engines.size());
  std::vector<char> alive(engines.size(), 0);
  on_all_engines(targets, "GET /health", [&](EngineApi& engine, std::size_t i) {
    engine.health();
    if (with_info) infos[i] = engine.server_info();
    alive[i] = 1;
  });
  for (std::size_t i = 0; with_info && i < engines.size(); ++i) {
    // A restarted engine may have another size; the next group is formed with its new one.
    if (alive[i]) rank_counts_[engines[i]] = infos[i].rank_count;
  }
  return alive;
}

std::vector<std::string> ElasticMembers::prepare_update(const std::function<void()>& connect) {
  updates_ += 1;
  if (policy_ != EngineFailurePolicy::kDrop) return {};
  connect();
  const std::vector<std::size_t> due = set_.due(updates_);
  if (due.empty()) return {};
  const std::vector<char> alive = probe(due, /*with_info=*/true);
  std::vector<std::string> back;
  for (std::size_t i = 0; i < due.size(); ++i) {
    if (!alive[i]) {
      set_.probe_failed(due[i], updates_);
      continue;
    }
    readmit(due[i]);
    back.push_back(engines_[due[i]]->url());
  }
  use_members(set_.members(), set_.epoch());
  return back;
}

void ElasticMembers::readmit(std::size_t engine) {
  const std::string stale = set_.readmit(engine);
  last_ids_[engine].clear();
  if (stale.empty()) return;
  // Our session from before the drop may still be open there (a stopped engine resumes in it);
  // only its id may end it. Best effort and bounded: a restarted engine has none (200), and a
  // session someone else opened meanwhile refuses (409) and makes our begin fail later.
  try {
    prober(engine).abort_weight_update({stale, false});
  } catch (const comm::Error&) {
  }
}

bool ElasticMembers::drop_failed(UpdateReport& report) {
  if (policy_ != EngineFailurePolicy::kDrop || report.ok) return false;
  // Blame only with evidence. The engines that are gone: no answer to /health within the probe
  // timeout. When all answer, the one the report blames: its error answer, its missing answer or
  // its dead connection failed the update. A failure that began on the trainer's side (its packer,
  // its tensors) points at nobody: the engines' errors then only echo the trainer's abort, so
  // nobody is dropped and the step fails.
  const std::vector<char> alive = probe(members_, /*with_info=*/false);
  std::vector<std::size_t> culprits;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (!alive[i]) culprits.push_back(members_[i]);
  }
  if (culprits.empty() && !report.trainer_fault) {
    for (std::size_t e : members_) {
      if (engines_[e]->url() == report.failed_engine) culprits.push_back(e);
    }
  }
  // The last engine is never dropped: with nobody left the update simply fails.
  if (culprits.empty() || culprits.size() >= members_.size()) return false;
  for (std::size_t e : culprits) {
    set_.drop(e, updates_, last_ids_[e]);
    report.dropped.push_back({engines_[e]->url(), report.error});
  }
  use_members(set_.members(), set_.epoch());
  return true;
}

void ElasticMembers::note_membership(UpdateReport& report) const {
  report.engines_current = 0;
  report.out.clear();
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    if (set_.current(e)) report.engines_current += 1;
    if (!set_.member(e)) report.out.push_back(engines_[e]->url());
  }
}

}  // namespace weightcast::sync::trainer
