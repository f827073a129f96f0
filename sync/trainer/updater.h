// DistributedUpdater: pushes a trainer's weights to a set of rollout engines, one update per
// call, with the selector the decision function chose.
//
// Usable from a trainer's own code without the launcher:
//
//   DistributedUpdater updater({"http://10.0.0.5:30000", "http://10.0.0.6:30000"}, options);
//   UpdateReport report = updater.update(named_tensors);  // report.ok, report.error, timings
//
// One update: version += 1; on all engines concurrently pause -> flush -> begin(selector); the
// buckets on the group; then update_weight_version -> end -> continue. Any failure takes the
// abort path: the failing engine is named, every engine is told to drop the session
// (/abort_weight_update) and to continue serving its previous weights, nobody commits, and the
// report carries the error; an SGLang engine, which has no abort, is told to end its session
// instead and is listed in report.needs_reload. With UpdaterOptions::on_engine_failure = kDrop
// the failing engine then leaves the set and the update is redone on the others (the elastic
// engine set: sync/trainer/engine_set.h, sync/trainer/elastic_members.h). Before the first update,
// /server_info of every engine is read: an engine that does not support the selector or backend is
// refused with a ConfigError rather than trusted to honour it; its rank count sizes the group.
// Pipeline-parallel trainers use the same steps one by one (launcher/train does): the stage-0
// source opens the session, hands session.token() to the other stage sources, each stage source
// sends its tensors on its own group (send_stage), stages one after another, and the coordinator
// finishes or aborts. update() is exactly prepare_update, then per attempt ensure_group(0) +
// open_session + send_stage(0) + finish, with drop_failed between attempts. Lifetime: owns the
// engine clients and the groups it created; destroying it asks every engine to leave those groups
// (best effort, bounded by the client timeouts) and stops their stores. Threading: one caller at a
// time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "sync/model/lora.h"
#include "sync/protocol/decision.h"
#include "sync/protocol/protocol.h"
#include "sync/trainer/bucket_sender.h"
#include "sync/trainer/colocated_sender.h"
#include "sync/trainer/delta_source.h"
#include "sync/trainer/elastic_members.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/engine_set.h"
#include "sync/trainer/group.h"
#include "sync/trainer/report.h"
#include "sync/trainer/session.h"
#include "sync/trainer/session_driver.h"
#include "sync/trainer/shard_classes.h"
#include "sync/trainer/sharded_stage.h"
#include "sync/trainer/stage_groups.h"
#include "sync/trainer/tensors.h"

namespace weightcast::sync::trainer {

struct UpdaterOptions {
  // The session selector. Unset: weight_update_selector(selector_config), the one decision.
  std::optional<Selector> selector;
  SelectorConfig selector_config;

  Backend backend = Backend::kGloo;
  // NCCL: the CUDA device the source's buckets are staged on and its communicator drives, and
  // colocate_memory kCuda's device segments (-1: the calling thread's current device). A trainer
  // and an engine on one machine each take their own.
  int cuda_device = -1;
  // Gloo: let processes of this user read this one's memory (PR_SET_PTRACER_ANY), so same-host
  // single copy works under Yama ptrace_scope 1 (comm::SingleCopyOptions::allow_same_user_reads).
  // The engines need it too (weightcast-engine --allow-same-user-reads).
  bool allow_same_user_reads = false;
  std::string group_prefix = "weightcast";  // groups are "<prefix>-pp_<stage>"
  // The address this process's store and data-plane endpoint bind; engines must reach it.
  std::string bind_address = "127.0.0.1";
  std::string token;  // bearer token of the engine routes
  // Reuse each engine's HTTP connections within an update (EngineClientOptions::keep_alive).
  bool keep_alive = true;
  std::string store_token;  // the group stores' token (engines: --store-token); empty: none
  PauseMode pause_mode = PauseMode::kAbort;
  // After the pause, flush_cache is retried while it answers non-200 (an SGLang engine refuses
  // while requests still hold cache blocks), up to flush_attempts times, flush_retry apart, as
  // Miles does (60 x 1 s). Skipped with PauseMode::kInPlace, which keeps the cache.
  int flush_attempts = 60;
  comm::Millis flush_retry{1000};
  // An SGLang engine left holding part of a failed update (it loads buckets in place and cannot
  // discard them) stays paused and is listed in report.needs_reload; with this set, it is
  // reloaded from this checkpoint (POST /update_weights_from_disk) and then resumed.
  std::string sglang_reload_path;
  // The lease taken on each weightcast engine (sync/engine/control/lease.h): its time to live;
  // unset: the engine's default. Released when the updater is destroyed.
  std::optional<std::uint64_t> lease_ttl_s;

  // The colocated path (sync/trainer/colocated_sender.h, docs/colocated.md) for the engines on
  // this host that offer it; the others stay on the chain, in the same update. kAuto: with Gloo.
  ColocateMode colocate = ColocateMode::kAuto;
  // Where its buckets lie: kHost (memfd segments) or kCuda (device segments on cuda_device,
  // handed out as CUDA IPC handles; a comm::ConfigError at the first update without a device).
  ColocateMemory colocate_memory = ColocateMemory::kHost;

  BucketSendOptions buckets;                 // bucket size, in-flight bound, data-phase timeout
  comm::Millis connect_timeout{5000};        // TCP connect to an engine
  comm::Millis request_timeout{60000};       // control routes
  comm::Millis group_timeout{120000};        // group setup, and each collective's default
  CommunicatorFactory communicator_factory;  // empty: comm::create_communicator

  // Engine dialects (sync/trainer/engine_api.h). Unset: each engine's is detected by connect().
  std::optional<EngineFlavor> engine_flavor;
  // Common mode, chosen when any engine is an SGLang one: a torch-compatible group on a torch
  // store of this generation, one bucket request in flight, buckets in this format
  // (kPerTensor or kFlattenedBucket, both of which SGLang receives).
  LoadFormat common_load_format = LoadFormat::kPerTensor;
  // kAuto: the generation the group's torch members speak (sync/trainer/group.h).
  comm::C10dProtocol torch_protocol = comm::C10dProtocol::kAuto;

  // What an engine failing an update does (sync/trainer/engine_set.h). kFail: the update fails
  // (today's behaviour). kDrop: the engine leaves the set, the update is redone on the others,
  // and the engine is probed between updates and re-admitted with a full update once it answers.
  EngineFailurePolicy on_engine_failure = EngineFailurePolicy::kFail;
  comm::Millis probe_timeout{2000};  // each /health (+ /server_info) probe of an engine
  int max_backoff_updates = 16;      // most updates between two probes of a dropped engine

  // Delta updates (sync/trainer/delta_source.h), native mode only: kAuto and kOn keep a base copy
  // per stage and send buckets as deltas against the version every engine confirmed holding
  // (kAuto: when the link is slow enough for the encode to pay off).
  DeltaMode delta = DeltaMode::kAuto;
  DeltaCodec delta_codec = kDefaultDeltaCodec;

  // Shard-aware broadcast (sync/trainer/sharded_stage.h, docs/sharding.md): engines that announce
  // shard plans get only their ranks' slices, one group per shard class.
  ShardMode shard = ShardMode::kAuto;

  // Who this updater is, in begin_weight_update's holder field: engines name it to anyone whose
  // begin they refuse ("engine busy, held by ..."). Empty: "<host>:<pid> <group_prefix>".
  std::string holder;
};

class DistributedUpdater {
 public:
  // HTTP clients (EngineClient) for `engine_urls`, in order (the order fixes rank offsets).
  DistributedUpdater(std::vector<std::string> engine_urls, UpdaterOptions options);
  // Any EngineApi implementation (tests, custom transports).
  DistributedUpdater(std::vector<std::unique_ptr<EngineApi>> engines, UpdaterOptions options);
  ~DistributedUpdater();
  DistributedUpdater(const DistributedUpdater&) = delete;
  DistributedUpdater& operator=(const DistributedUpdater&) = delete;

  // The selector of every session this updater opens (decided once, at construction).
  Selector selector() const { return selector_; }
  const UpdaterOptions& options() const { return options_; }
  std::span<EngineApi* const> engines() const { return engine_ptrs_; }

  // Reads /server_info from every engine (once; later calls return the cached answers). Throws
  // comm::ConfigError naming an engine that lacks the selector or the backend, EngineCallError
  // naming one that could not be asked.
  const std::vector<ServerInfoResponse>& connect();
  // After connect(): whether the group runs the common mode (some engine is an SGLang one).
  bool common_mode() const { return common_; }
  // After connect(): whether engine `engine` (an index into engines()) takes the colocated path
  // rather than the group's chain.
  bool colocated(std::size_t engine) const;
  // The format buckets travel in (native: kWeightcastBucket).
  LoadFormat load_format() const;

  // One whole update on group "<prefix>-pp_0". Engine, network and timeout failures come back
  // in the report (ok = false); configuration errors throw as connect() does. `version` is the
  // weight_version to commit; unset: one more than the highest numeric version seen. With
  // EngineFailurePolicy::kDrop: prepare_update(), then attempts until one commits on the
  // remaining engines (drop_failed() between them); the report names what was dropped.
  UpdateReport update(std::span<const NamedTensor> tensors,
                      std::optional<std::string> version = {});

  // One adapter update (docs/lora.md): `tensors`, an adapter's PEFT-named lora_A/lora_B, sent
  // on the same data plane and swapped in under `name` on every engine in one session of
  // selector target, whatever this updater's selector. Generation is not paused; the base
  // weights, their version and any draft stay as they are. `upsert` false: a load, which an
  // engine already holding `name` refuses. `version`: the adapter's; unset: one more than this
  // updater last committed for `name`. Every engine must take adapters (/server_info lists
  // lora_adapters), else comm::ConfigError naming it. Buckets go out as deltas against the adapter
  // of that name this updater last committed, where every engine confirms holding it (as update()
  // against the base weights; UpdaterOptions::delta).
  UpdateReport update_lora(const std::string& name, std::span<const NamedTensor> tensors,
                           const LoraConfig& config, bool upsert = true,
                           std::optional<std::string> version = {});

  // --- the elastic engine set (EngineFailurePolicy::kDrop; no-ops under kFail) ---

  // Before an update: probes the dropped engines whose probe is due (each bounded by
  // probe_timeout); one that answers is re-admitted (our stale session on it aborted by its id)
  // and the groups are re-formed with it at the next ensure_group(). Returns their URLs.
  std::vector<std::string> prepare_update();
  // After a failed attempt: the members that do not answer /health within probe_timeout (else
  // the engine `report` blames) leave the set; `report.dropped` names them. Returns whether the
  // update may be redone on the others (something was dropped and some engine remains).
  bool drop_failed(UpdateReport& report);
  // The stage sources of other pipeline stages follow the coordinator's set: the members and
  // epoch the session names (no-op for a session without members).
  void adopt(const UpdateSession& session);
  // Fills report.engines_current and report.out from the set.
  void note_membership(UpdateReport& report) const;
  // The engines the next update goes to (all of them under kFail).
  std::span<EngineApi* const> members() const { return elastic_.member_ptrs(); }
  const EngineSet& engine_set() const { return elastic_.engine_set(); }

  // --- building blocks, for trainers with several pipeline stages ---

  // Creates the group of `stage` unless it exists and is usable (a broken one is destroyed and
  // created anew). Throws as WeightGroup::create().
  void ensure_group(int stage);
  // Opens the next version's session on every engine. On failure runs the abort path, fills
  // `report` and returns nullopt.
  // With `adapter`: an adapter session (see update_lora(); `version` is the adapter's, unset:
  // one more than this updater last committed for it).
  std::optional<UpdateSession> open_session(UpdateReport& report,
                                            std::optional<std::string> version = {},
                                            std::optional<LoraBegin> adapter = std::nullopt);
  // Sends one stage's tensors on its group (ensure_group(stage) first). Never throws for engine
  // or data-plane failures: they are in the result.
  // `await_tensor`: see BucketSendOptions (tensors still being produced as buckets go out).
  BucketSendResult send_stage(
      const UpdateSession& session, int stage, std::span<const NamedTensor> tensors,
      std::function<void(const std::string&, comm::Deadline)> await_tensor = nullptr);
  // Optional, after ensure_group(): sets up now, ahead of the first update, what sending
  // `tensors` (the stage's, as send_stage() will get them) needs, so the first update costs what
  // a later one does: the chain packer's buffers, allocated and faulted in (none when every
  // engine takes the colocated path).
  void reserve_buffers(std::span<const TensorMeta> tensors);
  // Adds a stage's result to `report`; on failure runs the abort path.
  void record(const BucketSendResult& result, UpdateReport& report);
  // Commits: update_weight_version -> end -> continue on every engine. On failure runs the
  // abort path. Sets report.ok and report.seconds.
  void finish(const UpdateSession& session, UpdateReport& report);
  // The abort path: every engine where this updater opened the session drops it (by its id) and
  // continues on its previous weights; an engine that refused our begin because another client
  // holds it is left alone (its session is not ours). `report` gets `why` (and the blamed engine)
  // as its error.
  void abort(UpdateReport& report, const std::string& why);
  // This updater's holder text (UpdaterOptions::holder or the default).
  const std::string& holder() const { return holder_; }
  // Ends the leases this updater holds on its engines (best effort; the destructor does it too).
  void release_leases();

 private:
  // Decides colocated_ from the engines' /server_info (UpdaterOptions::colocate).
  void choose_colocated(const std::vector<ServerInfoResponse>& infos);
  // The members on the chain, as indices into engines_, in member order.
  std::vector<std::size_t> chain_members() const;
  // Every member's announced shard plans describe `tensors` (check_shard_plans()); a result that
  // fails naming each engine whose plan does not, before anything is sent.
  BucketSendResult check_plans(std::span<const NamedTensor> tensors) const;
  // Whether `chain` goes per shard class (ShardedStage): shard auto, native mode, and some
  // member of it announced plans.
  bool sharding(const std::vector<std::size_t>& chain) const;
  // The options of stage `stage`'s group of `chain` in `epoch` (name, backend, store,
  // rendezvous naming).
  GroupOptions group_options(int stage, std::uint64_t epoch,
                             const std::vector<std::size_t>& chain) const;
  UpdateReport update_once(std::span<const NamedTensor> tensors,
                           const std::optional<std::string>& version,
                           const std::optional<LoraBegin>& adapter = std::nullopt);
  // update()'s attempts, each after drop_failed() of the last.
  UpdateReport update_attempts(std::span<const NamedTensor> tensors,
                               const std::optional<std::string>& version,
                               const std::optional<LoraBegin>& adapter);

  UpdaterOptions options_;
  Selector selector_;
  std::vector<std::unique_ptr<EngineApi>> engines_;
  std::vector<EngineApi*> engine_ptrs_;
  std::string holder_;
  std::vector<ServerInfoResponse> infos_;
  std::vector<std::vector<ShardPlan>> shard_plans_;  // index: engine; empty: announced none
  std::vector<ShardClass> classes_;                  // of the chain, while sharding
  std::optional<std::uint64_t> classes_epoch_;       // the epoch classes_ were computed in
  bool common_ = false;
  std::vector<bool> colocated_;                                      // index: engine
  std::vector<std::unique_ptr<ColocatedSender>> colocated_senders_;  // index: stage
  int colocate_device_ = 0;  // colocate_memory kCuda: cuda_device, resolved (choose_colocated)
  StageGroups groups_;       // each stage's group, or its shard class groups
  // Delta updates: per stage, the base of what this process sent.
  std::vector<std::unique_ptr<DeltaSource>> delta_sources_;  // index: stage
  // ... and of each adapter it sent (lora_name: index: stage).
  std::map<std::string, std::vector<std::unique_ptr<DeltaSource>>> adapter_delta_sources_;
  ElasticMembers elastic_;  // which engines the update goes to; probes, drops, re-admissions
  SessionDriver sessions_;  // open, commit and abort on the members; leases
};

}  // namespace weightcast::sync::trainer
