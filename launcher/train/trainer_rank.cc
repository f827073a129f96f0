#include "launcher/train/trainer_rank.h"

#include <cinttypes>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/errors.h"
#include "comm/mpi/mpi_helpers.h"
#include "launcher/cli_util.h"
#include "launcher/train/engine_queries.h"
#include "launcher/train/lora_weights.h"
#include "launcher/train/rank_messages.h"
#include "launcher/train/rank_weights.h"
#include "launcher/train/stage_attempt.h"
#include "launcher/train/stage_gather.h"
#include "launcher/train/step_line.h"
#include "sync/trainer/engine_checks.h"
#include "sync/trainer/http/engine_client.h"
#include "sync/trainer/megatron.h"
#include "sync/trainer/stage_outcome.h"
#include "sync/trainer/updater.h"
#include "sync/trainer/verify.h"

namespace weightcast::launcher::train {

namespace {

using comm::Millis;
using namespace sync::trainer;
namespace mpi = comm::mpi;

class Rank {
 public:
  Rank(const TrainOptions& o, std::FILE* out)
      : o_(o),
        out_(out),
        spec_(resolve_model(o)),
        topo_(world_rank(), world_size(), o.tp, o.pp),
        params_(stage_params(spec_, topo_.pp_rank(), o.pp, expert_parallel(o))),
        // The first `ep` data-parallel replicas are the EP ranks; the others hold copies.
        ep_rank_(topo_.dp_rank() < o.ep ? topo_.dp_rank() : -1),
        weights_(o, spec_, params_, topo_.tp_rank(), ep_rank_),
        lora_(lora_config(o)) {
    // Every rank checks every stage, so a bad split fails all ranks alike instead of leaving
    // some waiting in a collective for the others.
    check_model_layout(o, spec_);
    stage_comm_ = mpi::stage_group(topo_, MPI_COMM_WORLD, mpi_deadline());
    sources_comm_ = mpi::split(MPI_COMM_WORLD, topo_.is_stage_source() ? 0 : 1, topo_.pp_rank(),
                               mpi_deadline());
    // The stage's TP and EP gather: whole, before the update opens; or overlap, in groups of
    // about a bucket on a thread of the source (needs MPI_THREAD_MULTIPLE), each group's buckets
    // broadcast while the next is gathered. auto (the default) takes what measured faster
    // (docs/performance.md): whole where the stage shares one host's cores, overlap where its
    // ranks span hosts and the gather can use the source's incoming link during the broadcast.
    gather_mode_ = o.tp_gather;
    if (gather_mode_ == "auto") {
      gather_mode_ = mpi::spans_hosts(stage_comm_.get(), mpi_deadline()) ? "overlap" : "whole";
    }
    const bool whole = gather_mode_ == "whole";
    gather_ = std::make_unique<StageGather>(
        params_, o.tp, topo_.tp_rank(), o.ep, ep_rank_,
        whole ? SIZE_MAX : updater_options(o, {}).buckets.bucket_bytes);
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    // A source alone in its stage has nothing to gather, only its own bytes to lay out: done
    // before the update opens, as the bench's weights are ready before it, rather than on a
    // thread racing the update's own (measured: 2.5x the bench overlapped, 1.0x before).
    threaded_gather_ = !whole && provided == MPI_THREAD_MULTIPLE && stage_comm_.size() > 1;
    // A source lays its stage out at setup (setup_sources()), once its engines' paths are known.
  }

  int run() {
    int code = setup();
    if (code == kExitOk && coordinator() && spec_.is_moe()) {
      // How the experts are spread: the EP ranks' shards join each stage's gather.
      std::fprintf(out_, "experts %lld ep %d (%s): %lld per EP rank\n",
                   static_cast<long long>(spec_.num_experts), o_.ep, o_.expert_layout.c_str(),
                   static_cast<long long>(spec_.num_experts / o_.ep));
      std::fflush(out_);
    }
    if (code == kExitOk && coordinator() && stage_comm_.size() > 1) {
      std::fprintf(out_, "stage gather %s%s\n", gather_mode_.c_str(),
                   o_.tp_gather == "auto" ? " (auto)" : "");
      std::fflush(out_);
    }
    if (code == kExitOk && coordinator() && o_.probe_accept_length) {
      // The reference: the engines' accept length on the weights they started with.
      std::fprintf(out_, "step 0/%d initial weights%s\n", o_.steps, probe_accept_lengths().c_str());
      std::fflush(out_);
    }
    for (int step = 1; step <= o_.steps && code == kExitOk; ++step) {
      // The training compute between two updates, simulated.
      if (step > 1 && o_.step_interval_ms > 0) {
        std::this_thread::sleep_for(Millis(o_.step_interval_ms));
      }
      code = run_step(step);
    }
    // --keep-going ran every step; a verification that failed on the way still fails the run.
    const bool verify_failed = checker_ && checker_->verify_failed();
    return code == kExitOk && verify_failed ? kExitUpdateFailed : code;
  }

 private:
  static int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  static int world_size() {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }
  bool coordinator() const { return topo_.world_rank() == 0; }
  comm::Deadline mpi_deadline(Millis extra = Millis(0)) const {
    return comm::deadline_after(Millis(o_.mpi_timeout_ms) + extra);
  }
  // The longest a source may spend on one stage's data phase, group setup included.
  Millis stage_budget() const { return train::stage_budget(o_); }
  Millis step_budget() const { return stage_budget() * (o_.pp + 1); }

  // Sets up what the sources need, and tells every rank whether it worked.
  int setup() {
    RankStatus result;
    if (topo_.is_stage_source()) result = setup_sources();
    result = broadcast_status(MPI_COMM_WORLD, 0, result, mpi_deadline(step_budget()));
    if (!result.ok() && coordinator()) {
      std::fprintf(out_, "setup FAILED: %s\n", result.text.c_str());
      std::fflush(out_);
    }
    return result.code;
  }

  // Coordinator decides the selector; then each stage, in order, creates its group.
  RankStatus setup_sources() {
    RankStatus decided = coordinator() ? decide_selector() : RankStatus{};
    decided = broadcast_status(sources_comm_.get(), 0, decided, mpi_deadline(stage_budget()));
    if (!decided.ok()) return decided;
    UpdaterOptions uo = updater_options(o_, {});
    uo.selector = sync::parse_selector(decided.text);
    uo.buckets.atomic_groups = atomic_group_rule(o_, spec_);
    updater_ = std::make_unique<DistributedUpdater>(o_.engines, uo);

    std::optional<RankStatus> first_failure;
    for (int s = 0; s < o_.pp; ++s) {
      RankStatus mine;
      if (s == topo_.pp_rank()) {
        mine = guarded([&] {
          updater_->ensure_group(s);
          // Colocated engines read the stage's tensors where they lie: in shared memory.
          bool colocated = false;
          for (std::size_t e = 0; e < updater_->engines().size(); ++e) {
            colocated = colocated || updater_->colocated(e);
          }
          std::vector<sync::TensorMeta> metas;
          if (lora_) {
            // The base is frozen: only the adapter is made and sent, never the stage's weights.
            lora_weights_ = std::make_unique<LoraWeights>(*lora_, params_, o_.seed, s);
            metas = lora_weights_->metas();
          } else {
            gather_->share_tensors(colocated);
            gather_->prepare(stage_comm_.size());
            for (const auto& param : params_)
              metas.insert(metas.end(), param.parts.begin(), param.parts.end());
          }
          // The first update should cost what the others do: its buffers are set up now.
          updater_->reserve_buffers(metas);
          if (lora_ && coordinator()) {
            std::string targets;
            for (const auto& t : lora_->target_modules) targets += (targets.empty() ? "" : ",") + t;
            std::fprintf(out_,
                         "lora %s rank %d alpha %g targets %s: %zu tensors, %s per step "
                         "(stage 0)\n",
                         o_.lora_name.c_str(), lora_->r, lora_->lora_alpha, targets.c_str(),
                         metas.size(), format_bytes(lora_weights_->byte_count()).c_str());
          }
          if (coordinator()) {
            const auto& infos = updater_->connect();
            for (std::size_t e = 0; e < infos.size(); ++e) {
              for (const auto& runner : infos[e].runners) {
                has_draft_ = has_draft_ || runner.name == sync::Runner::kDraft;
              }
              // Refused here, before any step, rather than at the first step's begin.
              if (lora_)
                check_takes_adapters(updater_->engines()[e]->url(), infos[e], o_.lora_name);
            }
            const auto engines = updater_->engines();
            for (std::size_t e = 0; e < engines.size(); ++e) {
              std::fprintf(out_, "engine %s flavor %s path %s\n", engines[e]->url().c_str(),
                           std::string(to_string(engines[e]->flavor())).c_str(),
                           updater_->colocated(e) ? "colocated" : "chain");
            }
          }
          if (coordinator()) {
            checker_ = std::make_unique<StepChecker>(o_, spec_, *updater_, has_draft_);
          }
          return rank_status(kExitOk, "");
        });
      }
      mine = broadcast_status(sources_comm_.get(), s, mine, mpi_deadline(stage_budget()));
      if (!mine.ok() && !first_failure) first_failure = mine;
    }
    return first_failure.value_or(decided);
  }

  RankStatus decide_selector() {
    return guarded([&] {
      sync::Selector selector;
      if (o_.selector == "auto") {
        std::optional<std::string> engines_algorithm;
        if (!o_.speculative_algorithm) engines_algorithm = engines_speculative_algorithm(o_);
        const auto config = selector_config(o_, spec_, engines_algorithm);
        selector = sync::weight_update_selector(config);
        std::fprintf(out_,
                     "selector %s (auto; speculative_algorithm=%s mtp_num_layers=%d "
                     "conversion=%s)\n",
                     std::string(sync::to_string(selector)).c_str(),
                     config.speculative_algorithm.value_or("none").c_str(),
                     config.mtp_num_layers.value_or(0), o_.conversion.c_str());
      } else {
        selector = sync::parse_selector(o_.selector);
        std::fprintf(out_, "selector %s (explicit)\n", o_.selector.c_str());
      }
      std::fflush(out_);
      return rank_status(kExitOk, std::string(sync::to_string(selector)));
    });
  }

  int run_step(int step);
  // --lora-rank: the stage sources send the step's adapter; the base weights are not touched.
  int run_adapter_step(int step);
  // This rank's shards at `step`: the generator's step (--drift jump), or the fp32 masters moved
  // one more optimizer-like step from the initial weights (--drift realistic).
  std::vector<std::byte> shards_at(int step) {
    std::optional<double> changed;
    std::vector<std::byte> shards = weights_.at(step, changed);
    if (checker_ && changed) checker_->set_changed(*changed);
    return shards;
  }
  RankStatus run_sources(int step, const std::vector<NamedTensor>& tensors);
  RankStatus step_line(int step, const RankStatus& opened, UpdateReport& report,
                       const std::vector<SentDigest>& digests);

  // " accept_length A,B,..." with --probe-accept-length, else empty.
  std::string probe_accept_lengths() {
    return o_.probe_accept_length ? accept_lengths(updater_->engines()) : std::string();
  }

  const TrainOptions& o_;
  std::FILE* out_;
  sync::ModelSpec spec_;
  mpi::Topology topo_;
  std::vector<MegatronParam> params_;  // the stage's, every EP rank's experts included
  int ep_rank_;                        // -1: a data-parallel replica past the EP ranks
  mpi::Comm stage_comm_;
  mpi::Comm sources_comm_;
  std::unique_ptr<DistributedUpdater> updater_;
  std::unique_ptr<StepChecker> checker_;       // coordinator only
  RankWeights weights_;                        // this rank's shards at each step
  std::optional<sync::LoraConfig> lora_;       // --lora-rank: adapters only, the base frozen
  std::unique_ptr<LoraWeights> lora_weights_;  // a stage source's adapter (with lora_)
  std::unique_ptr<StageGather> gather_;
  std::string gather_mode_;  // whole | overlap (auto resolved)
  bool threaded_gather_ = false;
  bool has_draft_ = false;  // some engine holds a draft runner (coordinator only)
  StepTimes times_;         // the step in progress, for its line's phases
};

int Rank::run_step(int step) {
  times_ = StepTimes{};
  times_.start = comm::Clock::now();
  if (lora_) return run_adapter_step(step);
  StageGather::Shards mine;
  if (ep_rank_ >= 0) mine = std::make_shared<const std::vector<std::byte>>(shards_at(step));
  times_.gen = comm::seconds_since(times_.start);
  RankStatus line;
  if (topo_.is_stage_source()) {
    // Stage ranks 0 .. tp-1 are the dp-0 replicas of TP ranks 0 .. tp-1. The buckets go out as
    // their tensors arrive (send_own_stage awaits each); a gather that failed ends the job.
    const auto gather_start = comm::Clock::now();
    gather_->start(stage_comm_.get(), std::move(mine), mpi_deadline(), threaded_gather_);
    // Without the gather thread the whole gather ran inside start(), before the update.
    if (!threaded_gather_) times_.gather = comm::seconds_since(gather_start);
    line = run_sources(step, gather_->tensors());
    gather_->finish();
  } else {
    gather_->contribute(stage_comm_.get(), mine, mpi_deadline());
  }
  line = broadcast_status(MPI_COMM_WORLD, 0, line, mpi_deadline(step_budget()));
  if (coordinator()) {
    std::fprintf(out_, "%s\n", line.text.c_str());
    std::fflush(out_);
  }
  return line.code;
}

int Rank::run_adapter_step(int step) {
  RankStatus line;
  if (topo_.is_stage_source()) {
    const std::vector<NamedTensor> adapter = lora_weights_->at(step);
    times_.gen = comm::seconds_since(times_.start);
    line = run_sources(step, adapter);
  }
  line = broadcast_status(MPI_COMM_WORLD, 0, line, mpi_deadline(step_budget()));
  if (coordinator()) {
    std::fprintf(out_, "%s\n", line.text.c_str());
    std::fflush(out_);
  }
  return line.code;
}

RankStatus Rank::run_sources(int step, const std::vector<NamedTensor>& tensors) {
  if (coordinator()) {
    try {
      updater_->prepare_update();  // probes and re-admits dropped engines (drop only)
    } catch (const comm::ConfigError&) {
      throw;
    } catch (const comm::Error& e) {
      std::fprintf(stderr, "weightcast-train: probing dropped engines: %s\n", e.what());
    }
  }
  UpdateReport report;
  std::vector<SentDigest> digests;
  std::vector<UpdateReport::Dropped> dropped;
  RankStatus opened;
  // Each failed attempt under --on-engine-failure drop drops an engine, so this is bounded by
  // the number of engines; the coordinator decides and tells the other sources.
  for (std::size_t attempts = 1;; ++attempts) {
    report = UpdateReport{};
    digests.clear();
    std::optional<AdapterStep> adapter;
    if (lora_) {
      // Upsert: the engines hold the last step's adapter under this name (or none yet).
      adapter =
          AdapterStep{{o_.lora_name, sync::to_json_string(*lora_), true}, std::to_string(step)};
    }
    opened = StageAttempt(o_, topo_, sources_comm_.get(), *updater_, *gather_,
                          adapter ? &*adapter : nullptr)
                 .run(tensors, report, digests, times_.verify);
    AttemptNext next = AttemptNext::kDone;
    if (coordinator()) {
      report.dropped.insert(report.dropped.begin(), dropped.begin(), dropped.end());
      if (!report.ok && attempts < o_.engines.size() && updater_->drop_failed(report)) {
        next = AttemptNext::kRetry;
      }
    }
    next = broadcast_next(sources_comm_.get(), 0, next, mpi_deadline(stage_budget()));
    if (next != AttemptNext::kRetry) break;
    dropped = report.dropped;
  }
  if (!coordinator()) return RankStatus{};
  updater_->note_membership(report);
  return step_line(step, opened, report, digests);
}

RankStatus Rank::step_line(int step, const RankStatus& opened, UpdateReport& report,
                           const std::vector<SentDigest>& digests) {
  char head[64];
  std::snprintf(head, sizeof(head), "step %d/%d ", step, o_.steps);
  const std::string members = checker_->membership(report);
  if (!opened.ok()) {
    // The report's summary also names engines left needing a reload (SGLang ones).
    if (!report.error.empty())
      return rank_status(kExitUpdateFailed, head + summary(report) + members);
    return rank_status(kExitUpdateFailed, head + std::string("FAILED version ") + report.version +
                                              ": " + opened.text + members);
  }
  if (!report.ok) return rank_status(kExitUpdateFailed, head + summary(report) + members);
  if (threaded_gather_) {
    const auto g = gather_->seconds();
    times_.gather = g.gather;
    times_.gather_wait = g.await;
  }
  const auto [code, line] =
      checker_->committed(step, report, digests, probe_accept_lengths(), times_);
  return rank_status(code, line);
}

}  // namespace

int run_trainer(const TrainOptions& options, std::FILE* out) {
  Rank rank(options, out);
  return rank.run();
}

}  // namespace weightcast::launcher::train
