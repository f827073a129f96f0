// UpdateReport: what one weight update did — version, selector, volume, per-phase timings — or
// why it failed, naming the engine and route that failed first.
//
// Failures are collected as EngineFailure entries (every engine call that failed, in the order
// they were seen); blame() picks the one to name: an engine that could not be reached at all
// beats one that timed out, which beats one that answered with an error. When an engine dies
// mid-update its peers fail too (their data-plane links break), and the dead engine is the one
// an operator must look at.
// Lifetime/threading: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sync/protocol/selector.h"

namespace weightcast::sync::trainer {

struct EngineFailure {
  std::string engine;  // URL
  std::string route;   // "POST /begin_weight_update"
  std::string message;
  bool unreachable = false;  // no HTTP answer: refused, reset, closed
  bool timed_out = false;
};

// Seconds spent in each phase of an update.
struct PhaseSeconds {
  double prepare = 0;  // server_info, group setup, bucket planning
  double pause = 0;    // pause_generation + flush_cache
  double begin = 0;    // begin_weight_update
  double data = 0;     // buckets: HTTP requests and broadcasts
  double commit = 0;   // update_weight_version + end_weight_update
  double resume = 0;   // continue_generation
};

struct UpdateReport {
  bool ok = false;
  std::string version;  // the version committed (or attempted)
  Selector selector = Selector::kAll;
  // An adapter update's lora_name (docs/lora.md); `version` is then the adapter's. Empty: the
  // base weights.
  std::string adapter;
  std::uint64_t tensors = 0;
  std::uint64_t bytes = 0;  // tensor bytes sent (without bucket padding)
  std::uint64_t buckets = 0;
  std::uint64_t wire_bytes = 0;     // bytes broadcast: full buckets (with padding), delta payloads
  std::uint64_t delta_buckets = 0;  // buckets that travelled as deltas
  double seconds = 0;               // whole update, pause to continue
  PhaseSeconds phases;
  // Within `data`: time the source waited for bucket answers and for the packer. What is left
  // is the data plane itself.
  double http_wait_seconds = 0;
  double pack_wait_seconds = 0;
  // Within `data` too: time on the data plane itself (the broadcasts), and time the source
  // waited for its own digests of a bucket's tensors before sending the bucket's request.
  double wire_seconds = 0;
  double hash_wait_seconds = 0;
  // How the buckets travelled (comm::Communicator::data_path(): single-copy, chain, gloo-tree,
  // nccl), as the group agreed; the coordinating stage's group for a pipeline-parallel update.
  std::string data_path;
  // --delta auto changed its mind at this update (DeltaSource::change()); empty when it did not.
  std::string delta_change;

  std::string error;          // empty when ok
  std::string failed_engine;  // URL of the engine blamed; empty when no engine was at fault
  // The failure began on the trainer's side (its packing, its tensors' source): no engine is
  // blamed, whatever the engines answered after the trainer aborted the data plane.
  bool trainer_fault = false;
  std::string failed_route;
  std::vector<EngineFailure> failures;
  // Engines left holding part of a failed update (SGLang ones, which cannot discard it): each
  // needs a fresh group and a full update before it serves the trainer's weights.
  std::vector<std::string> needs_reload;
  // SGLang engines that held part of it and were reloaded from UpdaterOptions::sglang_reload_path,
  // then resumed.
  std::vector<std::string> reloaded;

  // The elastic engine set (--on-engine-failure drop, sync/trainer/engine_set.h).
  struct Dropped {
    std::string engine;  // URL
    std::string why;     // the failed attempt's error
  };
  std::vector<Dropped> dropped;         // engines dropped during this update
  std::vector<std::string> readmitted;  // engines re-admitted that this update made current
  std::vector<std::string> out;         // engines outside the set after this update
  std::size_t engines_current = 0;      // members that hold this update's version (when ok)
  // Some engine was dropped now or is still out: the update reached fewer engines than given.
  bool degraded() const { return !dropped.empty() || !out.empty(); }

  // bytes / seconds / 1e9; 0 when nothing was timed.
  double gbps() const;
  // Sets error / failed_engine / failed_route from failures (see blame()) unless error is set;
  // with trainer_fault, only error.
  void fail(std::string what);
};

// The failure to name (see the header comment); nullptr for an empty list.
const EngineFailure* blame(const std::vector<EngineFailure>& failures);

// "engine http://h:p POST /route: message".
std::string to_string(const EngineFailure& failure);

// "engines current 2 dropped 1 readmitted 0" and, when degraded, " degraded: dropped URL (why);
// out URL,...". Empty for an updater with a fixed set (nothing dropped, nothing out).
std::string membership_summary(const UpdateReport& report, std::size_t engines);

// The phases of an update as key=value tokens, e.g. "pause=0.001 begin=0.002 pack=0.000
// hash=0.000 wire=0.020 answers=0.003 commit=0.002 resume=0.001" (seconds; pack, hash, wire
// and answers lie within the data phase; what they leave of it is the sender's own work).
std::string phase_summary(const UpdateReport& report);

// One line: "version 3 selector target tensors 29 bytes 3.1 MiB buckets 7 seconds 0.210
// GB/s 0.015 phases pause=... (phase_summary())" or "FAILED version 3: <error>".
std::string summary(const UpdateReport& report);

}  // namespace weightcast::sync::trainer
