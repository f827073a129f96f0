// EngineSet: which engines a trainer updates (the elastic engine set, `--on-engine-failure drop`),
// as pure bookkeeping: membership, the group epoch, and when to probe a dropped engine again.
//
// An engine that failed an update is dropped: it leaves the set and the epoch grows, so every
// stage group is re-formed under a new name ("<prefix>-pp_<stage>-e<epoch>") that no stale member
// can join. A dropped engine is probed between steps; the first probe is due the step after the
// drop, and each failed probe doubles the wait (in steps, capped), as does each new drop of an
// engine that had not stayed current for a while, so an engine that keeps failing is not retried
// every step. One that answers is re-admitted (epoch grows again) but counts as current only once
// an update committed on it: a re-admitted engine starts from whatever it holds, and only a full
// update brings it to the trainer's version.
// No I/O here: ElasticMembers (elastic_members.h) probes, aborts and re-forms groups and
// tells this object what happened. Lifetime/threading: a plain value, one owner thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::sync::trainer {

// What the trainer does when an engine fails an update.
enum class EngineFailurePolicy {
  kFail,  // the update fails (the engines keep their previous weights); the caller decides
  kDrop,  // the engine leaves the set and the update is redone on the others
};
std::string_view to_string(EngineFailurePolicy policy);
// "fail" or "drop"; comm::ConfigError otherwise.
EngineFailurePolicy parse_engine_failure_policy(std::string_view text);

class EngineSet {
 public:
  // `engines` engines, all members and current; probes back off to at most `max_backoff_steps`.
  explicit EngineSet(std::size_t engines, int max_backoff_steps = 16);

  std::size_t size() const { return engines_.size(); }
  std::uint64_t epoch() const { return epoch_; }
  // Members, in engine order (the order fixes rank offsets).
  std::vector<std::size_t> members() const;
  std::vector<std::size_t> dropped() const;
  bool member(std::size_t e) const { return engines_.at(e).member; }
  // A member that committed an update since it was (re)admitted.
  bool current(std::size_t e) const { return engines_.at(e).member && engines_.at(e).current; }
  // Members not yet current (re-admitted, awaiting their first full update).
  std::vector<std::size_t> pending() const;

  // Engine `e` failed at `step`: it leaves the set (epoch + 1); `session_id` is the session it
  // may still hold of ours ("" for none), to abort by its id when it answers again.
  void drop(std::size_t e, int step, std::string session_id = {});
  // Dropped engines whose probe is due at `step`.
  std::vector<std::size_t> due(int step) const;
  // The probe of `e` at `step` got no answer: the next one waits twice as long.
  void probe_failed(std::size_t e, int step);
  // The step (>= the drop's) of `e`'s next probe.
  int next_probe(std::size_t e) const { return engines_.at(e).next_probe; }
  // `e` answered: a member again (epoch + 1), not yet current. Returns the session id to abort.
  std::string readmit(std::size_t e);
  // An update committed on every member: all are current. Returns those that just became so.
  std::vector<std::size_t> committed();

 private:
  struct Engine {
    bool member = true;
    bool current = true;
    int backoff = 1;     // steps between probes
    int strikes = 0;     // drops not yet forgiven by a stable run
    int stable = 0;      // commits since the last (re)admission
    int next_probe = 0;  // step of the next probe (dropped engines)
    std::string stale_session;
  };
  std::vector<Engine> engines_;
  std::uint64_t epoch_ = 0;
  int max_backoff_;
};

}  // namespace weightcast::sync::trainer
