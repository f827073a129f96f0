// DistributedUpdater's session protocol: opening the update's session on every member, the
// commit (update_weight_version -> end -> continue) and the abort path (updater.h).
#include <algorithm>

#include "comm/deadline.h"
#include "comm/errors.h"
#include "sync/trainer/engine_calls.h"
#include "sync/trainer/updater.h"
#include "sync/trainer/updater_detail.h"

namespace weightcast::sync::trainer {

using comm::seconds_since;
using detail::numeric_version;

std::optional<UpdateSession> DistributedUpdater::open_session(UpdateReport& report,
                                                              std::optional<std::string> version) {
  connect();
  start_report(report, version);
  update_start_ = comm::Clock::now();
  session_ids_.assign(members_.size(), std::string());
  busy_.assign(members_.size(), 0);
  std::vector<BeginWeightUpdateResponse> answers(members_.size());

  auto t = comm::Clock::now();
  PauseGenerationRequest pause{options_.pause_mode};
  auto failures = on_all_engines(member_ptrs_, "POST /pause_generation",
                                 [&pause](EngineApi& engine, std::size_t) {
                                   engine.pause_generation(pause);
                                   engine.flush_cache();
                                 });
  report.phases.pause = seconds_since(t);
  if (failures.empty()) {
    t = comm::Clock::now();
    BeginWeightUpdateRequest begin{selector_, holder_};
    failures = on_all_engines(
        member_ptrs_, "POST /begin_weight_update", [&](EngineApi& engine, std::size_t e) {
          BeginWeightUpdateResponse answer;
          try {
            answer = engine.begin_weight_update(begin);
          } catch (const EngineError& error) {
            // 409: another client's session is open there. It is not ours to touch.
            if (error.status() == 409) busy_[e] = 1;
            throw;
          }
          session_ids_[e] = answer.session_id;
          answers[e] = answer;
          if (answer.selector != begin.selector) {
            throw EngineError(engine.url(), "POST /begin_weight_update", 200,
                              "session recorded selector '" +
                                  std::string(to_string(answer.selector)) + "', asked for '" +
                                  std::string(to_string(begin.selector)) + "'");
          }
        });
    report.phases.begin = seconds_since(t);
  }
  if (!failures.empty()) {
    report.failures.insert(report.failures.end(), failures.begin(), failures.end());
    const bool any_busy = std::any_of(busy_.begin(), busy_.end(), [](char b) { return b != 0; });
    abort(report, any_busy ? "opening the update session failed: engine busy"
                           : "opening the update session failed");
    return std::nullopt;
  }
  UpdateSession session(selector_, report.version, session_ids_);
  if (members_hold_last_commit(answers)) session.delta_base_ = last_commit_->version;
  // Until this update commits everywhere, no member is known to hold a common version.
  last_commit_.reset();
  if (options_.on_engine_failure == EngineFailurePolicy::kFail) return session;
  return std::move(session).with_members(members_, epoch_);
}

bool DistributedUpdater::members_hold_last_commit(
    const std::vector<BeginWeightUpdateResponse>& answers) const {
  if (options_.delta == DeltaMode::kOff || common_ || !last_commit_) return false;
  if (last_commit_->members.size() != members_.size()) return false;
  for (std::size_t e = 0; e < members_.size(); ++e) {
    const auto& [engine, digest] = last_commit_->members[e];
    if (engine != members_[e] || digest.empty() || answers[e].runner_digest != digest ||
        answers[e].weight_version != last_commit_->version) {
      return false;
    }
  }
  return true;
}

void DistributedUpdater::finish(const UpdateSession& session, UpdateReport& report) {
  WC_ENFORCE_EQ(session.version(), report.version, "report of another session");
  auto t = comm::Clock::now();
  auto failures = on_all_engines(
      member_ptrs_, "POST /update_weight_version", [&session](EngineApi& engine, std::size_t e) {
        engine.update_weight_version({session.version(), false, session.session_id(e)});
      });
  std::vector<std::string> digests(member_ptrs_.size());
  if (failures.empty()) {
    failures = on_all_engines(member_ptrs_, "POST /end_weight_update",
                              [&session, &digests](EngineApi& engine, std::size_t e) {
                                const auto answer =
                                    engine.end_weight_update({session.session_id(e)});
                                digests[e] = answer.runner_digest;
                                if (answer.weight_version != session.version()) {
                                  throw EngineError(engine.url(), "POST /end_weight_update", 200,
                                                    "committed version '" + answer.weight_version +
                                                        "', expected '" + session.version() + "'");
                                }
                              });
  }
  report.phases.commit = seconds_since(t);
  if (!failures.empty()) {
    report.failures.insert(report.failures.end(), failures.begin(), failures.end());
    abort(report, "committing the update failed");
    return;
  }
  committed_version_ =
      std::max(committed_version_ + 1, numeric_version(session.version()));  // explicit: as given
  session_ids_.clear();  // committed: the sessions are closed
  // Every member now holds this version, with the digest it answered (delta updates check both
  // again at the next begin).
  last_commit_ = Commit{session.version(), {}};
  for (std::size_t e = 0; e < members_.size(); ++e) {
    last_commit_->members.emplace_back(members_[e], e < digests.size() ? digests[e] : "");
  }
  for (std::size_t e : set_.committed()) report.readmitted.push_back(engines_[e]->url());
  t = comm::Clock::now();
  failures =
      on_all_engines(member_ptrs_, "POST /continue_generation", [](EngineApi& engine, std::size_t) {
        engine.continue_generation(ContinueGenerationRequest{});
      });
  report.phases.resume = seconds_since(t);
  report.seconds = seconds_since(update_start_);
  if (!failures.empty()) {
    // Committed everywhere, but some engine did not resume: still an error to report.
    report.failures.insert(report.failures.end(), failures.begin(), failures.end());
    report.fail("update committed, but resuming generation failed");
    return;
  }
  report.ok = true;
}

void DistributedUpdater::abort(UpdateReport& report, const std::string& why) {
  report.fail(why);
  // Best effort on every engine, the failed ones included (one that answered 4xx is alive):
  // drop the session and staging, then serve the previous weights again.
  on_all_engines(member_ptrs_, "POST /abort_weight_update",
                 [this](EngineApi& engine, std::size_t e) {
                   if (e < busy_.size() && busy_[e]) return;  // someone else's session: hands off
                   const std::string id = e < session_ids_.size() ? session_ids_[e] : std::string();
                   if (engine.flavor() == EngineFlavor::kSglang) {
                     // No abort on SGLang: it loaded what arrived in place. End its session so it
                     // serves again; it is reported as needing a fresh group and a full reload.
                     engine.end_weight_update({});
                   } else if (!id.empty()) {
                     engine.abort_weight_update({id, false});
                   }
                   engine.continue_generation(ContinueGenerationRequest{});
                 });
  for (std::size_t i = 0; i < members_.size(); ++i) {
    const bool ours = i >= busy_.size() || !busy_[i];
    if (ours && member_ptrs_[i]->flavor() == EngineFlavor::kSglang) {
      report.needs_reload.push_back(member_ptrs_[i]->url());
    }
    // Kept for the engine's re-admission, should it leave the set now.
    if (i < session_ids_.size() && ours) last_ids_[members_[i]] = session_ids_[i];
  }
  session_ids_.clear();  // the sessions are over (or were never ours)
  busy_.clear();
  if (update_start_ != comm::Clock::time_point{}) report.seconds = seconds_since(update_start_);
}

}  // namespace weightcast::sync::trainer
