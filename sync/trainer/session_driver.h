// SessionDriver: a DistributedUpdater's session protocol on the members of its engine set:
// opening the update's session on every member (pause -> flush -> begin), the commit
// (update_weight_version -> end -> continue), the abort path, and the leases the engines granted.
// It keeps what one update needs between those steps (the members' session ids, which refused us
// as busy, whether buckets may have reached them) and what the next needs from the last (the
// committed version, the last commit's runner digests for delta updates, and each adapter's).
// Lifetime: owned by its DistributedUpdater; borrows its options, holder text and members.
// Threading: one caller at a time (the abort path's engine calls write the report under a lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/deadline.h"
#include "sync/protocol/protocol.h"
#include "sync/trainer/elastic_members.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/report.h"
#include "sync/trainer/session.h"

namespace weightcast::sync::trainer {

struct UpdaterOptions;

namespace detail {
// An engine's weight_version as a number, when it is one ("3"); anything else counts as 0.
std::uint64_t numeric_version(const std::string& text);
}  // namespace detail

class SessionDriver {
 public:
  SessionDriver(const UpdaterOptions& options, Selector selector, const std::string& holder,
                std::span<EngineApi* const> engines, ElasticMembers& members);

  // What connect() learnt: whether the group runs the common mode, and the highest numeric
  // version the engines hold.
  void set_engines(bool common, std::uint64_t committed_version);
  // The report's selector, and its version: `version`, else one more than the last committed.
  void start_report(UpdateReport& report, const std::optional<std::string>& version) const;
  // See DistributedUpdater::open_session() (after connect()). With `adapter`: an adapter
  // session of selector target (docs/lora.md), `version` the adapter's; generation is neither
  // paused nor flushed (requests keep the adapter they took), and the base weights' delta base
  // and committed version stay as they are.
  std::optional<UpdateSession> open(UpdateReport& report, std::optional<std::string> version,
                                    std::optional<LoraBegin> adapter = std::nullopt);
  // See DistributedUpdater::finish().
  void finish(const UpdateSession& session, UpdateReport& report);
  // The version an adapter update of `name` commits unless told: one more than the last this
  // driver committed for it ("1" for the first).
  std::string next_adapter_version(const std::string& name) const;
  // See DistributedUpdater::abort().
  void abort(UpdateReport& report, const std::string& why);
  // See DistributedUpdater::release_leases().
  void release_leases();

 private:
  // flush_cache, retried while the engine answers non-200 (UpdaterOptions::flush_attempts).
  void flush_with_retries(EngineApi& engine) const;
  // An SGLang engine holding part of a failed update: reloaded and resumed, or left paused and
  // listed in report.needs_reload (UpdaterOptions::sglang_reload_path).
  void recover_sglang(EngineApi& engine, UpdateReport& report);
  struct Commit;
  // Whether every member's begin answer shows `commit` still in place: the base weights' version
  // and runner digest, or with `adapter` the adapter's (lora_version, lora_digest).
  bool members_hold(const Commit& commit, const std::vector<BeginWeightUpdateResponse>& answers,
                    bool adapter) const;

  const UpdaterOptions& options_;
  const Selector selector_;
  const std::string& holder_;
  std::vector<EngineApi*> engines_;
  ElasticMembers& members_;
  bool common_ = false;
  std::uint64_t committed_version_ = 0;
  comm::Clock::time_point update_start_{};
  // The update in progress, per member: the session id it answered ("" = none yet), and whether
  // it refused our begin because someone else holds a session there.
  std::vector<std::string> session_ids_;
  std::vector<char> busy_;
  std::vector<char> begun_;  // per member: its begin succeeded
  // Per member: the base weights' version its begin answered (an adapter commit leaves it).
  std::vector<std::string> begin_versions_;
  bool paused_ = false;  // the update in progress paused generation (adapter sessions do not)
  // Whether the update in progress got past begin (buckets may have reached the engines).
  bool data_started_ = false;
  std::mutex report_mu_;  // the abort path's concurrent writes to the report
  // Per engine: the lease it granted this updater ("" = none).
  std::vector<std::string> lease_ids_;
  // The last update committed on every member, with the runner digest each member's
  // end_weight_update answered (an adapter's: its lora_digest).
  struct Commit {
    std::string version;
    std::vector<std::pair<std::size_t, std::string>> members;  // engine index, digest
  };
  std::optional<Commit> last_commit_;
  std::map<std::string, std::uint64_t> adapter_versions_;  // lora_name: last committed
  // lora_name: its last update, while it is known to be on every member (adapter deltas).
  std::map<std::string, Commit> adapter_commits_;
};

}  // namespace weightcast::sync::trainer
