#include "launcher/bench/update.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "launcher/bench/engines.h"
#include "launcher/bench/process_stats.h"
#include "launcher/bench/step_weights.h"
#include "launcher/bench/update_sets.h"
#include "launcher/cli_util.h"
#include "sync/model/drift.h"
#include "sync/model/model.h"
#include "sync/trainer/updater.h"

namespace weightcast::launcher {
namespace {

using std::chrono::milliseconds;

BenchTable update_table() {
  return BenchTable("update", {{"step", 6, 0},
                               {"mode", 6, 0},
                               {"seconds", 10, 3},
                               {"GB/s", 9, 3},
                               {"wire", 11, 0},
                               {"changed%", 9, 2},
                               {"buckets", 8, 0},
                               {"delta_bkts", 10, 0},
                               {"data(s)", 9, 3},
                               {"pack(s)", 8, 3},
                               {"hash(s)", 8, 3},
                               {"wire(s)", 8, 3},
                               {"answers(s)", 10, 3},
                               {"commit(s)", 9, 3},
                               {"control(s)", 10, 3},
                               {"outside%", 9, 1},
                               {"http_wait%", 10, 1},
                               {"src_peakRSS", 12, 0}});
}

// One run of the bench: the engine sets, the weights of each step, the table and the totals.
class UpdateBench {
 public:
  UpdateBench(const UpdateBenchOptions& o, const std::string& self, const sync::ModelSpec& spec,
              std::string label)
      : o_(o),
        self_(self),
        label_(std::move(label)),
        metas_(sync::hf_tensors(spec)),
        model_bytes_(sync::total_bytes(metas_)),
        spec_file_(write_model_spec(spec)),
        sets_(make_sets(o, self, spec_file_.path(), model_bytes_)),
        weights_(metas_, o.drift == "realistic", sync::kRealisticLr, o.digest_at == "write",
                 o.compare_colocate || o.colocate != "off"),
        table_(update_table()) {}

  // The set under test's mean GB/s over its counted updates (0 when none succeeded).
  double mean_gbps() const {
    const UpdateSet& main_set = sets_.back();
    return main_set.ok && main_set.seconds > 0
               ? static_cast<double>(model_bytes_) * main_set.ok / main_set.seconds / 1e9
               : 0;
  }
  std::uint64_t model_bytes() const { return model_bytes_; }
  std::size_t tensors() const { return metas_.size(); }

  int run() {
    // As a trainer does at start-up (weightcast-train): the buffers of the first update ahead.
    for (UpdateSet& set : sets_) set.updater->reserve_buffers(metas_);
    begin_table();
    for (int step = 1; step <= o_.iters; ++step) run_step(step);
    note_memory_and_stop_engines();
    if (o_.raw) measure_raw();
    table_.write(o_.output);
    return failed_ || table_.wrong() ? 1 : 0;
  }

 private:
  // The head note, then the table's header.
  void begin_table() {
    char head[320];
    std::snprintf(
        head, sizeof(head),
        "weightcast-bench update: %zu engines x %d ranks per set (delta %s%s, colocate %s), "
        "model %s%s (%zu tensors), bucket %s, %d updates, drift %s, codec %s, gloo%s",
        sets_[0].urls.size(), o_.ranks_per_engine, o_.delta.c_str(),
        o_.compare_full ? " vs off" : "", o_.compare_colocate ? "off vs on" : o_.colocate.c_str(),
        label_.c_str(), format_bytes(model_bytes_).c_str(), metas_.size(),
        format_bytes(o_.bucket_bytes).c_str(), o_.iters, o_.drift.c_str(), o_.delta_codec.c_str(),
        o_.single_copy ? "" : " without single copy");
    table_.begin(head);
  }

  // Every set's update to the weights of `step`, then the delta-vs-full ratio when comparing.
  void run_step(int step) {
    const double changed = weights_.advance(step);
    if (step > 1 || o_.iters == 1) {
      digest_seconds_ += weights_.digest_seconds();
      ++digest_steps_;
    }
    const auto tensors = weights_.views();
    std::vector<sync::trainer::UpdateReport> reports;
    for (UpdateSet& set : sets_) reports.push_back(update_set(set, step, changed, tensors));
    if (sets_.size() == 2 && reports[0].ok && reports[1].ok && step > 1) {
      if (o_.compare_colocate) {
        note_colocated_vs_chain(step, reports[0], reports[1]);
      } else {
        note_delta_vs_full(step, reports[0], reports[1], changed);
      }
    }
  }

  // One set's update: a row, and the set's sums after the first step. Returns its report.
  sync::trainer::UpdateReport update_set(UpdateSet& set, int step, double changed,
                                         const std::vector<sync::trainer::NamedTensor>& tensors) {
    auto r = set.updater->update(tensors);
    if (!r.ok) {
      table_.note("update " + std::to_string(step) + " (" + set.mode + ") FAILED: " + r.error);
      ++failed_;
      return r;
    }
    if (step == 1) table_.note("set " + set.mode + ": buckets travel by " + r.data_path);
    const std::uint64_t wrong =
        wrong_tensors(set.urls, metas_, weights_.storage(), milliseconds(o_.timeout_ms));
    // Data plane = the bucket phase less the time spent waiting on HTTP answers and packing.
    const double plane = r.phases.data - r.http_wait_seconds - r.pack_wait_seconds;
    // The requests around the buckets: pause and flush, begin, version and end, continue.
    const double control = r.phases.pause + r.phases.begin + r.phases.commit + r.phases.resume;
    table_.add({std::to_string(step), set.mode, r.seconds, r.gbps(), r.wire_bytes, 100 * changed,
                r.buckets, r.delta_buckets, r.phases.data, r.pack_wait_seconds, r.hash_wait_seconds,
                r.wire_seconds, r.http_wait_seconds, r.phases.commit, control,
                100 * (1.0 - plane / r.seconds), 100 * r.http_wait_seconds / r.seconds,
                format_bytes(self_peak_rss())},
               wrong);
    if (step > 1 || o_.iters == 1) {
      set.seconds += r.seconds;
      set.wire += r.wire_bytes;
      set.ok += 1;
    }
    return r;
  }

  void note_delta_vs_full(int step, const sync::trainer::UpdateReport& full,
                          const sync::trainer::UpdateReport& delta, double changed) {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "step %d: delta %s vs full: %.1fx less on the wire, %.2fx faster end to end "
                  "(%.2f%% of elements changed)",
                  step, sets_[1].mode.c_str(),
                  static_cast<double>(full.wire_bytes) / static_cast<double>(delta.wire_bytes),
                  full.seconds / delta.seconds, 100 * changed);
    table_.note(buf);
  }

  void note_colocated_vs_chain(int step, const sync::trainer::UpdateReport& chain,
                               const sync::trainer::UpdateReport& colocated) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "step %d: colocated (%s) vs chain (%s): %.2fx the chain's throughput", step,
                  colocated.data_path.c_str(), chain.data_path.c_str(),
                  chain.seconds / colocated.seconds);
    table_.note(buf);
  }

  void note_memory_and_stop_engines() {
    std::vector<pid_t> pids;
    for (auto& set : sets_) {
      for (const auto& p : set.local.processes) pids.push_back(p->pid());
    }
    note_memory(table_, pids, model_bytes_, o_.bucket_bytes);
    for (auto& set : sets_) set.local.processes.clear();
  }

  // The raw chain broadcast of the same bytes to as many ranks as the set under test has.
  void measure_raw() {
    const UpdateSet& main_set = sets_.back();
    const double update_s = main_set.ok ? main_set.seconds / main_set.ok : 0;
    const int receivers = static_cast<int>(main_set.urls.size()) * o_.ranks_per_engine;
    const double raw_s = raw_chain_seconds(o_, self_, model_bytes_, receivers);
    table_.add(
        {std::string("raw"), std::string("-"), raw_s,
         static_cast<double>(model_bytes_) / raw_s / 1e9, model_bytes_, 0.0, std::uint64_t{1},
         std::uint64_t{0}, raw_s, 0.0, 0.0, raw_s, 0.0, 0.0, 0.0, 0.0, 0.0, std::string("-")},
        0);
    if (!main_set.ok) return;
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "update (%s) avg %.3f s (%.3f GB/s); raw gloo-chain of the same %s to %d ranks "
                  "%.3f s; update / raw = %.2fx of raw throughput; #wrong total %llu",
                  main_set.mode.c_str(), update_s,
                  static_cast<double>(model_bytes_) / update_s / 1e9,
                  format_bytes(model_bytes_).c_str(), receivers, raw_s, raw_s / update_s,
                  static_cast<unsigned long long>(table_.wrong()));
    table_.note(buf);
    if (o_.compare_colocate && sets_.front().ok) {
      const double chain_s = sets_.front().seconds / sets_.front().ok;
      std::snprintf(buf, sizeof(buf), "update (chain) avg %.3f s; chain / raw = %.2fx", chain_s,
                    raw_s / chain_s);
      table_.note(buf);
    }
    if (o_.digest_at == "write" && digest_steps_ > 0) {
      const double digest_s = digest_seconds_ / digest_steps_;
      std::snprintf(buf, sizeof(buf),
                    "the source's digests were made as the weights were written: %.3f s per "
                    "step outside the update (update + them / raw = %.2fx; --digest-at send "
                    "hashes inside the update)",
                    digest_s, raw_s / (update_s + digest_s));
      table_.note(buf);
    }
  }

  const UpdateBenchOptions& o_;
  const std::string& self_;
  const std::string label_;  // "moe-1g " or empty
  const std::vector<sync::TensorMeta> metas_;
  const std::uint64_t model_bytes_;
  const TempFile spec_file_;
  std::vector<UpdateSet> sets_;
  StepWeights weights_;
  double digest_seconds_ = 0;  // the source's digests at write, summed over steps after the first
  int digest_steps_ = 0;
  BenchTable table_;
  int failed_ = 0;
};

}  // namespace

int run_update_bench(const UpdateBenchOptions& o, const std::string& self) {
  if (o.models.empty()) {
    return UpdateBench(o, self, sync::model_spec_for_bytes(o.model_bytes), "").run();
  }
  // Each model in turn, fresh engines each, then their GB/s side by side (against the first);
  // with several rounds, every other round reversed, and each model's median ratio.
  int code = 0;
  const std::size_t n = o.models.size();
  std::vector<std::vector<double>> gbps(n);  // [model][round]
  std::vector<std::uint64_t> bytes(n);
  std::vector<std::size_t> tensors(n);
  for (int round = 0; round < o.rounds; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t m = round % 2 == 0 ? k : n - 1 - k;
      const std::string& name = o.models[m];
      if (o.rounds > 1) std::printf("# round %d of %d: %s\n", round + 1, o.rounds, name.c_str());
      UpdateBench bench(o, self, sync::model_preset(name), name + " ");
      code = std::max(code, bench.run());
      gbps[m].push_back(bench.mean_gbps());
      bytes[m] = bench.model_bytes();
      tensors[m] = bench.tensors();
    }
  }
  std::printf("# models in this run (mean of updates after the first%s):\n",
              o.rounds > 1 ? "; per round, rounds in order" : "");
  for (std::size_t m = 0; m < n; ++m) {
    std::vector<double> ratios;
    std::string per_round;
    for (std::size_t r = 0; r < gbps[m].size(); ++r) {
      const double first = gbps[0][r];
      ratios.push_back(first > 0 ? gbps[m][r] / first : 0.0);
      char cell[64];
      std::snprintf(cell, sizeof(cell), "%s%.3f GB/s %.2fx", r == 0 ? "" : ", ", gbps[m][r],
                    ratios.back());
      per_round += cell;
    }
    std::sort(ratios.begin(), ratios.end());
    const std::size_t half = ratios.size() / 2;
    const double median =
        ratios.size() % 2 == 1 ? ratios[half] : (ratios[half - 1] + ratios[half]) / 2;
    std::printf("#   %-14s %10s %6zu tensors: %s; median %.2fx of %s\n", o.models[m].c_str(),
                format_bytes(bytes[m]).c_str(), tensors[m], per_round.c_str(), median,
                o.models.front().c_str());
  }
  std::fflush(stdout);
  return code;
}

}  // namespace weightcast::launcher
