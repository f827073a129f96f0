#include "sync/trainer/engine_set.h"

#include <algorithm>
#include <utility>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync::trainer {

namespace {
// Commits in a row after which an engine's earlier drops are forgiven.
constexpr int kStableCommits = 4;

constexpr auto kPolicies = comm::enum_names<EngineFailurePolicy>(
    "on-engine-failure policy",
    {{EngineFailurePolicy::kFail, "fail"}, {EngineFailurePolicy::kDrop, "drop"}});
}  // namespace

std::string_view to_string(EngineFailurePolicy policy) {
  return kPolicies.name(policy);
}

EngineFailurePolicy parse_engine_failure_policy(std::string_view text) {
  return parse_name<comm::ConfigError>(kPolicies, text);
}

EngineSet::EngineSet(std::size_t engines, int max_backoff_steps)
    : engines_(engines), max_backoff_(std::max(1, max_backoff_steps)) {}

std::vector<std::size_t> EngineSet::members() const {
  std::vector<std::size_t> out;
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    if (engines_[e].member) out.push_back(e);
  }
  return out;
}

std::vector<std::size_t> EngineSet::dropped() const {
  std::vector<std::size_t> out;
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    if (!engines_[e].member) out.push_back(e);
  }
  return out;
}

std::vector<std::size_t> EngineSet::pending() const {
  std::vector<std::size_t> out;
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    if (engines_[e].member && !engines_[e].current) out.push_back(e);
  }
  return out;
}

void EngineSet::drop(std::size_t e, int step, std::string session_id) {
  Engine& engine = engines_.at(e);
  WC_ENFORCE(engine.member, "engine ", e, " dropped twice");
  engine.member = false;
  engine.current = false;
  if (engine.stable >= kStableCommits) engine.strikes = 0;
  // The first drop is probed at once (the next step); an engine that fails again soon after its
  // re-admission waits 2, 4, ... steps.
  engine.backoff = std::min(max_backoff_, 1 << std::min(engine.strikes, 16));
  engine.strikes += 1;
  engine.stable = 0;
  engine.next_probe = step + engine.backoff;
  if (!session_id.empty()) engine.stale_session = std::move(session_id);
  epoch_ += 1;
}

std::vector<std::size_t> EngineSet::due(int step) const {
  std::vector<std::size_t> out;
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    if (!engines_[e].member && engines_[e].next_probe <= step) out.push_back(e);
  }
  return out;
}

void EngineSet::probe_failed(std::size_t e, int step) {
  Engine& engine = engines_.at(e);
  WC_ENFORCE(!engine.member, "probe of member engine ", e);
  engine.backoff = std::min(max_backoff_, engine.backoff * 2);
  engine.next_probe = step + engine.backoff;
}

std::string EngineSet::readmit(std::size_t e) {
  Engine& engine = engines_.at(e);
  WC_ENFORCE(!engine.member, "engine ", e, " re-admitted while a member");
  engine.member = true;
  engine.current = false;
  engine.stable = 0;
  epoch_ += 1;
  return std::exchange(engine.stale_session, std::string());
}

std::vector<std::size_t> EngineSet::committed() {
  std::vector<std::size_t> out;
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    Engine& engine = engines_[e];
    if (!engine.member) continue;
    if (!engine.current) out.push_back(e);
    engine.current = true;
    engine.stable += 1;
  }
  return out;
}

}  // namespace weightcast::sync::trainer
