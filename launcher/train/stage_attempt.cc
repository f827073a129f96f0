#include "launcher/train/stage_attempt.h"

#include <functional>
#include <string>

#include "sync/trainer/engine_calls.h"

namespace weightcast::launcher::train {

using comm::Millis;
using namespace sync::trainer;
namespace mpi = comm::mpi;

Millis stage_budget(const TrainOptions& o) {
  return Millis(o.update_timeout_ms) + Millis(o.group_timeout_ms) +
         Millis(4 * o.request_timeout_ms);
}

comm::Deadline StageAttempt::deadline() const {
  return comm::deadline_after(Millis(o_.mpi_timeout_ms) + stage_budget(o_));
}

StageOutcome StageAttempt::send_own_stage(const std::optional<UpdateSession>& session,
                                          const std::vector<NamedTensor>& tensors) {
  StageOutcome outcome;
  try {
    updater_.adopt(*session);  // the coordinator's engine set for this attempt
    updater_.ensure_group(topo_.pp_rank());
    std::function<void(const std::string&, comm::Deadline)> await;
    // An adapter's tensors are made whole on the source: nothing to wait for.
    if (!adapter_) {
      await = [this](const std::string& name, comm::Deadline deadline) {
        gather_.await(name, deadline);
      };
    }
    outcome.result = updater_.send_stage(*session, topo_.pp_rank(), tensors, std::move(await));
    outcome.sent = true;
  } catch (const EngineCallError& e) {
    // Which engine failed the group setup: the coordinator's drop decision needs it.
    outcome.error = "stage " + std::to_string(topo_.pp_rank()) + ": " + e.what();
    outcome.result.failures = e.failures();
    outcome.result.ok = false;
  } catch (const std::exception& e) {
    outcome.error = "stage " + std::to_string(topo_.pp_rank()) + ": " + e.what();
    outcome.result.ok = false;
  }
  return outcome;
}

RankStatus StageAttempt::run(const std::vector<NamedTensor>& tensors, UpdateReport& report,
                             std::vector<SentDigest>& digests, double& verify_seconds) {
  std::optional<UpdateSession> session;
  RankStatus opened = rank_status(kExitUpdateFailed, "");
  if (coordinator()) {
    opened = guarded([&] {
      session = adapter_ ? updater_.open_session(report, adapter_->version, adapter_->begin)
                         : updater_.open_session(report);
      return session ? rank_status(kExitOk, session->token())
                     : rank_status(kExitUpdateFailed, report.error);
    });
  }
  opened = broadcast_status(sources_, 0, opened, deadline());
  if (opened.ok() && !coordinator()) session = join_session(opened.text);

  bool failed = !opened.ok();
  for (int s = 0; s < o_.pp; ++s) {
    StageOutcome own;
    if (s == topo_.pp_rank() && !failed) own = send_own_stage(session, tensors);
    // Stage s+1 starts only once this returns: the explicit serialization of the stages.
    const StageOutcome outcome = broadcast_outcome(sources_, s, own, deadline());
    if (failed) continue;
    if (coordinator()) {
      if (outcome.error.empty()) {
        updater_.record(outcome.result, report);
      } else {
        report.failures = outcome.result.failures;
        updater_.abort(report, outcome.error);
      }
      digests.insert(digests.end(), outcome.digests.begin(), outcome.digests.end());
    }
    failed = !outcome.sent || !outcome.result.ok;
  }
  if (coordinator() && opened.ok() && report.error.empty()) {
    updater_.finish(*session, report);
  }
  // The digests --verify compares are taken after the commit, outside the timed update: the
  // other sources hash while the coordinator commits.
  if (o_.verify && !failed) exchange_digests(tensors, digests, verify_seconds);
  return opened;
}

void StageAttempt::exchange_digests(const std::vector<NamedTensor>& tensors,
                                    std::vector<SentDigest>& digests, double& seconds) {
  const auto start = comm::Clock::now();
  for (int s = 0; s < o_.pp; ++s) {
    std::string text;
    if (s == topo_.pp_rank()) text = to_text(sent_digests(tensors));
    text = mpi::broadcast_string(sources_, s, std::move(text), deadline());
    if (coordinator()) {
      const auto stage = parse_sent_digests(text);
      digests.insert(digests.end(), stage.begin(), stage.end());
    }
  }
  seconds = comm::seconds_since(start);
}

}  // namespace weightcast::launcher::train
