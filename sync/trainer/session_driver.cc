#include "sync/trainer/session_driver.h"

#include <algorithm>
#include <charconv>
#include <thread>
#include <utility>

#include "comm/errors.h"
#include "sync/trainer/engine_calls.h"
#include "sync/trainer/updater.h"

namespace weightcast::sync::trainer {

namespace detail {

std::uint64_t numeric_version(const std::string& text) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size() ? value : 0;
}

}  // namespace detail

using comm::seconds_since;
using detail::numeric_version;

SessionDriver::SessionDriver(const UpdaterOptions& options, Selector selector,
                             const std::string& holder, std::span<EngineApi* const> engines,
                             ElasticMembers& members)
    : options_(options),
      selector_(selector),
      holder_(holder),
      engines_(engines.begin(), engines.end()),
      members_(members),
      lease_ids_(engines_.size()) {}

void SessionDriver::set_engines(bool common, std::uint64_t committed_version) {
  common_ = common;
  committed_version_ = committed_version;
}

void SessionDriver::start_report(UpdateReport& report,
                                 const std::optional<std::string>& version) const {
  report.selector = selector_;
  report.version = version ? *version : std::to_string(committed_version_ + 1);
}

std::optional<UpdateSession> SessionDriver::open(UpdateReport& report,
                                                 std::optional<std::string> version,
                                                 std::optional<LoraBegin> adapter) {
  start_report(report, version);
  const Selector selector = adapter ? Selector::kTarget : selector_;
  report.selector = selector;
  update_start_ = comm::Clock::now();
  session_ids_.assign(members_.members().size(), std::string());
  busy_.assign(members_.members().size(), 0);
  begun_.assign(members_.members().size(), 0);
  begin_versions_.assign(members_.members().size(), std::string());
  std::vector<BeginWeightUpdateResponse> answers(members_.members().size());

  data_started_ = false;
  // An adapter swaps in atomically beside running requests: nothing to pause or flush.
  paused_ = !adapter;
  auto t = comm::Clock::now();
  PauseGenerationRequest pause{options_.pause_mode};
  std::vector<EngineFailure> failures;
  if (paused_) {
    failures = on_all_engines(members_.member_ptrs(), "POST /pause_generation",
                              [&](EngineApi& engine, std::size_t) {
                                engine.pause_generation(pause);
                                // An in-place pause keeps the cache, as Miles does.
                                if (pause.mode != PauseMode::kInPlace) flush_with_retries(engine);
                              });
  }
  report.phases.pause = seconds_since(t);
  if (failures.empty()) {
    t = comm::Clock::now();
    failures = on_all_engines(
        members_.member_ptrs(), "POST /begin_weight_update", [&](EngineApi& engine, std::size_t e) {
          BeginWeightUpdateRequest begin{selector, holder_};
          begin.lora = adapter;
          if (!lease_ids_[members_.members()[e]].empty())
            begin.lease_id = lease_ids_[members_.members()[e]];
          begin.lease_ttl_s = options_.lease_ttl_s;
          BeginWeightUpdateResponse answer;
          try {
            answer = engine.begin_weight_update(begin);
          } catch (const EngineError& error) {
            // 409: another client's session is open there. It is not ours to touch.
            if (error.status() == 409) busy_[e] = 1;
            throw;
          }
          session_ids_[e] = answer.session_id;
          begin_versions_[e] = answer.weight_version;
          begun_[e] = 1;
          if (!answer.lease_id.empty()) lease_ids_[members_.members()[e]] = answer.lease_id;
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
  // From here on buckets may reach the engines: an SGLang engine loads them in place.
  data_started_ = true;
  UpdateSession session(selector, report.version, session_ids_);
  if (adapter) {
    // The base weights stay as they are: their delta base and last commit with them. The
    // adapter's own last commit is its delta base.
    session.adapter_ = adapter->name;
    if (const auto it = adapter_commits_.find(adapter->name); it != adapter_commits_.end()) {
      if (members_hold(it->second, answers, true)) session.delta_base_ = it->second.version;
      adapter_commits_.erase(it);  // as last_commit_ below, until this update commits
    }
  } else {
    if (last_commit_ && members_hold(*last_commit_, answers, false)) {
      session.delta_base_ = last_commit_->version;
    }
    // Until this update commits everywhere, no member is known to hold a common version.
    last_commit_.reset();
  }
  if (options_.on_engine_failure == EngineFailurePolicy::kFail) return session;
  return std::move(session).with_members(members_.members(), members_.epoch());
}

std::string SessionDriver::next_adapter_version(const std::string& name) const {
  const auto it = adapter_versions_.find(name);
  return std::to_string((it == adapter_versions_.end() ? 0 : it->second) + 1);
}

void SessionDriver::flush_with_retries(EngineApi& engine) const {
  for (int attempt = 1;; ++attempt) {
    try {
      engine.flush_cache();
      return;
    } catch (const EngineError& e) {
      // No answer at all: the engine is gone, retrying only costs time.
      if (e.unreachable() || attempt >= options_.flush_attempts) throw;
    }
    std::this_thread::sleep_for(options_.flush_retry);
  }
}

void SessionDriver::release_leases() {
  std::vector<EngineApi*> held;
  std::vector<std::string> ids;
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    if (lease_ids_[e].empty()) continue;
    held.push_back(engines_[e]);
    ids.push_back(std::exchange(lease_ids_[e], std::string()));
  }
  // Best effort: an engine that does not answer lets the lease expire after its time to live.
  on_all_engines(held, "POST /release_weight_update_lease",
                 [&ids](EngineApi& engine, std::size_t i) {
                   engine.release_lease({ids[i], false});
                 });
}

bool SessionDriver::members_hold(const Commit& commit,
                                 const std::vector<BeginWeightUpdateResponse>& answers,
                                 bool adapter) const {
  if (options_.delta == DeltaMode::kOff || common_) return false;
  if (commit.members.size() != members_.members().size()) return false;
  for (std::size_t e = 0; e < members_.members().size(); ++e) {
    const auto& [engine, digest] = commit.members[e];
    const auto& answer = answers[e];
    const bool holds =
        adapter ? answer.lora_digest == digest && answer.lora_version == commit.version
                : answer.runner_digest == digest && answer.weight_version == commit.version;
    if (engine != members_.members()[e] || digest.empty() || !holds) return false;
  }
  return true;
}

void SessionDriver::finish(const UpdateSession& session, UpdateReport& report) {
  WC_ENFORCE_EQ(session.version(), report.version, "report of another session");
  auto t = comm::Clock::now();
  auto failures = on_all_engines(
      members_.member_ptrs(), "POST /update_weight_version",
      [&session](EngineApi& engine, std::size_t e) {
        // Without sessions (slime-era SGLang) each bucket carried the version and applied it.
        if (!engine.sessions()) return;
        engine.update_weight_version({session.version(), false, session.session_id(e)});
      });
  std::vector<std::string> digests(members_.member_ptrs().size());
  if (failures.empty()) {
    failures = on_all_engines(
        members_.member_ptrs(), "POST /end_weight_update", [&](EngineApi& engine, std::size_t e) {
          const auto answer = engine.end_weight_update({session.session_id(e)});
          digests[e] = session.adapter() ? answer.lora_digest : answer.runner_digest;
          // An adapter commit leaves the base weights' version.
          const std::string& expected = session.adapter() ? begin_versions_[e] : session.version();
          if (answer.weight_version != expected) {
            throw EngineError(
                engine.url(), "POST /end_weight_update", 200,
                "committed version '" + answer.weight_version + "', expected '" + expected + "'");
          }
        });
  }
  report.phases.commit = seconds_since(t);
  if (!failures.empty()) {
    report.failures.insert(report.failures.end(), failures.begin(), failures.end());
    abort(report, "committing the update failed");
    return;
  }
  // Every member now holds this version, with the digest it answered (delta updates check both
  // again at the next begin).
  Commit commit{session.version(), {}};
  for (std::size_t e = 0; e < members_.members().size(); ++e) {
    commit.members.emplace_back(members_.members()[e], e < digests.size() ? digests[e] : "");
  }
  if (session.adapter()) {
    auto& last = adapter_versions_[*session.adapter()];
    last = std::max(last + 1, numeric_version(session.version()));
    adapter_commits_[*session.adapter()] = std::move(commit);
    session_ids_.clear();
    report.seconds = seconds_since(update_start_);
    report.ok = true;
    return;
  }
  committed_version_ =
      std::max(committed_version_ + 1, numeric_version(session.version()));  // explicit: as given
  session_ids_.clear();  // committed: the sessions are closed
  last_commit_ = std::move(commit);
  for (std::size_t e : members_.committed()) report.readmitted.push_back(engines_[e]->url());
  t = comm::Clock::now();
  failures = on_all_engines(members_.member_ptrs(), "POST /continue_generation",
                            [](EngineApi& engine, std::size_t) {
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

void SessionDriver::abort(UpdateReport& report, const std::string& why) {
  report.fail(why);
  std::vector<char> half_updated(members_.member_ptrs().size(), 0);
  for (std::size_t i = 0; i < members_.member_ptrs().size(); ++i) {
    const bool ours = i >= busy_.size() || !busy_[i];
    // An SGLang engine loaded what arrived in place and cannot discard it: once buckets may
    // have reached it, resuming it would serve a mix of old and new weights.
    half_updated[i] =
        ours && data_started_ && members_.member_ptrs()[i]->flavor() == EngineFlavor::kSglang;
  }
  // Best effort on every engine, the failed ones included (one that answered 4xx is alive):
  // drop the session and staging, then serve the previous weights again.
  on_all_engines(members_.member_ptrs(), "POST /abort_weight_update",
                 [&](EngineApi& engine, std::size_t e) {
                   if (e < busy_.size() && busy_[e]) return;  // someone else's session: hands off
                   const std::string id = e < session_ids_.size() ? session_ids_[e] : std::string();
                   if (engine.flavor() == EngineFlavor::kSglang) {
                     if (half_updated[e]) {
                       recover_sglang(engine, report);
                       return;
                     }
                     // Nothing reached it: end the (empty) session it opened, then resume.
                     if (e < begun_.size() && begun_[e] && engine.sessions()) {
                       engine.end_weight_update({});
                     }
                   } else if (!id.empty()) {
                     engine.abort_weight_update({id, false});
                   }
                   if (paused_) engine.continue_generation(ContinueGenerationRequest{});
                 });
  for (std::size_t i = 0; i < members_.members().size(); ++i) {
    const bool ours = i >= busy_.size() || !busy_[i];
    // Kept for the engine's re-admission, should it leave the set now.
    if (i < session_ids_.size() && ours)
      members_.remember_session(members_.members()[i], session_ids_[i]);
  }
  session_ids_.clear();  // the sessions are over (or were never ours)
  busy_.clear();
  begun_.clear();
  data_started_ = false;
  if (update_start_ != comm::Clock::time_point{}) report.seconds = seconds_since(update_start_);
}

void SessionDriver::recover_sglang(EngineApi& engine, UpdateReport& report) {
  const std::string& path = options_.sglang_reload_path;
  if (path.empty()) {
    std::lock_guard lock(report_mu_);
    report.needs_reload.push_back(engine.url());
    return;  // stays paused: it must not generate on mixed weights
  }
  try {
    engine.update_weights_from_disk(path);
  } catch (const comm::Error&) {
    std::lock_guard lock(report_mu_);
    report.needs_reload.push_back(engine.url());
    throw;  // on_all_engines records it; the engine stays paused
  }
  engine.continue_generation(ContinueGenerationRequest{});
  std::lock_guard lock(report_mu_);
  report.reloaded.push_back(engine.url());
}

}  // namespace weightcast::sync::trainer
