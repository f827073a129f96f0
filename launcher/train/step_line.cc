#include "launcher/train/step_line.h"

#include <cinttypes>
#include <cstdio>

#include "launcher/cli_util.h"
#include "launcher/train/trainer_rank.h"

namespace weightcast::launcher::train {

using namespace sync::trainer;

StepChecker::StepChecker(const TrainOptions& options, const sync::ModelSpec& spec,
                         DistributedUpdater& updater, bool has_draft)
    : o_(options), spec_(spec), updater_(updater), has_draft_(has_draft) {
  follow();
  if (!verifier_) return;
  for (const auto& url : verifier_->unverifiable()) {
    std::fprintf(stderr,
                 "weightcast-train: verify: cannot verify engine %s: it serves no "
                 "/weights_checksum (sglang); verifying the other engines\n",
                 url.c_str());
  }
}

void StepChecker::follow() {
  if (!o_.verify) return;
  const auto members = updater_.members();
  if (verifier_ && std::equal(members.begin(), members.end(), engines_.begin(), engines_.end())) {
    return;
  }
  engines_.assign(members.begin(), members.end());
  const auto& all = updater_.engines();
  std::vector<sync::ServerInfoResponse> infos;
  for (EngineApi* e : engines_) {
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (all[i] == e) infos.push_back(updater_.connect()[i]);
    }
  }
  verifier_ = std::make_unique<UpdateVerifier>(engines_, infos, spec_, o_.seed);
}

std::string StepChecker::membership(const UpdateReport& report) const {
  if (o_.on_engine_failure != "drop") return "";
  return " " + membership_summary(report, updater_.engines().size());
}

void StepChecker::set_changed(double fraction) {
  char text[48] = "";
  if (fraction >= 0) std::snprintf(text, sizeof(text), " changed %.2f%%", 100 * fraction);
  changed_ = text;
}

std::pair<int, std::string> StepChecker::committed(int step, const UpdateReport& report,
                                                   const std::vector<SentDigest>& digests,
                                                   const std::string& accept, StepTimes times) {
  const auto verify_start = comm::Clock::now();
  char head[64];
  std::snprintf(head, sizeof(head), "step %d/%d ", step, o_.steps);
  std::string verified = "no", target_ok = "-", draft_ok = "-";
  if (verifier_) {
    follow();
    std::vector<UpdateVerifier::Problem> problems;
    if (report.adapter.empty()) {
      verifier_->apply(report.selector, digests);
      problems = verifier_->check(report.version);
    } else {
      // An adapter update: the adapter's bytes exact, and the base and draft as they were.
      problems = verifier_->check_adapter(report.adapter, report.version, digests);
      const auto base = verifier_->check_unchanged();
      problems.insert(problems.end(), base.begin(), base.end());
    }
    bool call_failed = false, target_bad = false, draft_bad = false;
    for (const auto& p : problems) {
      if (!p.runner) {
        call_failed = true;
      } else {
        (*p.runner == sync::Runner::kDraft ? draft_bad : target_bad) = true;
      }
    }
    target_ok = call_failed || target_bad ? "no" : "yes";
    if (has_draft_) draft_ok = call_failed || draft_bad ? "no" : "yes";
    if (!problems.empty()) {
      std::string text = head + std::string("VERIFY FAILED version ") + report.version + ": " +
                         std::to_string(problems.size()) +
                         " problem(s); first: " + problems[0].text + membership(report);
      for (std::size_t i = 1; i < problems.size() && i < 8; ++i) {
        std::fprintf(stderr, "weightcast-train: verify: %s\n", problems[i].text.c_str());
      }
      if (!o_.keep_going) return {kExitUpdateFailed, text};
      std::fprintf(stderr, "weightcast-train: %s\n", text.c_str());
      verify_failed_ = true;
    } else {
      verified = "yes";
    }
  }
  times.verify += comm::seconds_since(verify_start);
  char phases[160];
  std::snprintf(phases, sizeof(phases), " phases gen=%.3f gather=%.3f gather_wait=%.3f ", times.gen,
                times.gather, times.gather_wait);
  char tail[64];
  std::snprintf(tail, sizeof(tail), " verify=%.3f step=%.3f", times.verify,
                comm::seconds_since(times.start));
  char line[896];
  std::snprintf(
      line, sizeof(line),
      "step %d/%d %sversion %s selector %s bytes %" PRIu64 " (%s) buckets %" PRIu64
      " seconds %.3f GB/s %.3f verified %s target_ok %s draft_ok %s wire %" PRIu64
      " (%s) delta_buckets %" PRIu64 " path %s%s%s",
      step, o_.steps, report.adapter.empty() ? "" : ("lora " + report.adapter + " ").c_str(),
      report.version.c_str(), std::string(sync::to_string(report.selector)).c_str(), report.bytes,
      format_bytes(report.bytes).c_str(), report.buckets, report.seconds, report.gbps(),
      verified.c_str(), target_ok.c_str(), draft_ok.c_str(), report.wire_bytes,
      format_bytes(report.wire_bytes).c_str(), report.delta_buckets,
      report.data_path.empty() ? "-" : report.data_path.c_str(), changed_.c_str(), accept.c_str());
  return {kExitOk, line + membership(report) + phases + phase_summary(report) + tail};
}

}  // namespace weightcast::launcher::train
