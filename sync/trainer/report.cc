#include "sync/trainer/report.h"

#include <cstdio>

namespace weightcast::sync::trainer {

double UpdateReport::gbps() const {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

const EngineFailure* blame(const std::vector<EngineFailure>& failures) {
  const auto rank = [](const EngineFailure& f) { return f.unreachable ? 0 : f.timed_out ? 1 : 2; };
  const EngineFailure* best = nullptr;
  for (const auto& f : failures) {
    if (best == nullptr || rank(f) < rank(*best)) best = &f;
  }
  return best;
}

std::string to_string(const EngineFailure& failure) {
  // Client errors already name the engine and route (and say "no answer" when there was none);
  // others get them prepended.
  if (failure.message.find(failure.engine) != std::string::npos) return failure.message;
  return "engine " + failure.engine + " " + failure.route + ": " + failure.message;
}

void UpdateReport::fail(std::string what) {
  ok = false;
  if (!error.empty()) return;
  if (const EngineFailure* f = trainer_fault ? nullptr : blame(failures)) {
    failed_engine = f->engine;
    failed_route = f->route;
    error = what + ": " + to_string(*f);
  } else {
    error = std::move(what);
  }
}

std::string membership_summary(const UpdateReport& report, std::size_t engines) {
  std::string text = "engines current " + std::to_string(report.engines_current) + "/" +
                     std::to_string(engines) + " dropped " + std::to_string(report.dropped.size()) +
                     " readmitted " + std::to_string(report.readmitted.size());
  std::string back;
  for (const auto& url : report.readmitted) back += (back.empty() ? "" : ",") + url;
  if (!back.empty()) text += " (" + back + ")";
  if (!report.degraded()) return text;
  text += " degraded:";
  for (const auto& d : report.dropped) text += " dropped " + d.engine + " (" + d.why + ");";
  std::string out;
  for (const auto& url : report.out) out += (out.empty() ? "" : ",") + url;
  if (!out.empty()) text += " out " + out;
  return text;
}

std::string phase_summary(const UpdateReport& report) {
  char text[256];
  const PhaseSeconds& p = report.phases;
  std::snprintf(text, sizeof(text),
                "pause=%.3f begin=%.3f pack=%.3f hash=%.3f wire=%.3f answers=%.3f commit=%.3f "
                "resume=%.3f",
                p.pause, p.begin, report.pack_wait_seconds, report.hash_wait_seconds,
                report.wire_seconds, report.http_wait_seconds, p.commit, p.resume);
  return text;
}

std::string summary(const UpdateReport& report) {
  if (!report.ok) {
    std::string text = "FAILED version " + report.version + ": " + report.error;
    for (const auto& url : report.needs_reload) {
      text += "; engine " + url +
              " (sglang) cannot discard a partial update: it needs a fresh group and a full "
              "reload, and stays paused until then (POST /update_weights_from_disk "
              "{\"model_path\": <checkpoint>}, then POST /continue_generation; or rerun with "
              "--sglang-reload-path)";
    }
    for (const auto& url : report.reloaded) {
      text += "; engine " + url + " (sglang) reloaded from the checkpoint and resumed";
    }
    return text;
  }
  char line[256];
  std::snprintf(line, sizeof(line),
                "version %s selector %s tensors %llu bytes %llu buckets %llu seconds %.3f "
                "GB/s %.3f",
                report.version.c_str(), std::string(to_string(report.selector)).c_str(),
                static_cast<unsigned long long>(report.tensors),
                static_cast<unsigned long long>(report.bytes),
                static_cast<unsigned long long>(report.buckets), report.seconds, report.gbps());
  std::string text = line;
  if (!report.delta_change.empty()) text += " (" + report.delta_change + ")";
  return text + " phases " + phase_summary(report);
}

}  // namespace weightcast::sync::trainer
