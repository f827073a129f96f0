// In-process stand-ins for the updater's tests: FakeWire + FakeCommunicator (the data plane: a
// broadcast appends the source's bytes to the wire) and FakeEngine (the control plane: records
// every call, answers like an engine, and unpacks each bucket from the wire once its broadcast
// happened, as a real engine answers a bucket only after receiving it).
// Failure injection: FakeEngine::fail_route makes one route throw (unreachable or with a status).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "sync/model/bucket.h"
#include "sync/trainer/engine_api.h"
#include "sync/trainer/updater.h"
#include "tests/support/engine_api_overrides.h"

namespace weightcast::sync::trainer::testing {

// Shared event log and broadcast record.
struct FakeWire {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::byte>> broadcasts;
  std::vector<std::string> events;  // "<engine> <route> [detail]" and "broadcast <k>"
  bool aborted = false;
  std::chrono::milliseconds broadcast_delay{0};
  // Look-ahead check: broadcast k waits (up to 2 s) until `engines` engines have received the
  // request of bucket k+1 (for k+1 < total_buckets); a broadcast that had to go without it is
  // counted in missing_lookahead. A sender that waits for bucket k's answer before sending the
  // request of k+1 cannot pass.
  int engines = 0;
  std::size_t total_buckets = 0;
  std::map<std::uint64_t, int> requests_seen;  // sequence -> engines that received it
  int missing_lookahead = 0;
  // Throw from the broadcast of this index (-1: never).
  int fail_broadcast_at = -1;

  void log(std::string event) {
    std::lock_guard lock(mu);
    events.push_back(std::move(event));
  }
  std::vector<std::string> snapshot() {
    std::lock_guard lock(mu);
    return events;
  }
  // Index of the first event equal to `event`, or -1.
  int index_of(const std::string& event) {
    std::lock_guard lock(mu);
    for (std::size_t i = 0; i < events.size(); ++i) {
      if (events[i] == event) return static_cast<int>(i);
    }
    return -1;
  }
};

class FakeCommunicator final : public comm::Communicator {
 public:
  FakeCommunicator(FakeWire& wire, int size) : wire_(wire), size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "fake"; }
  std::string_view data_path() const override { return "fake"; }
  comm::Millis default_timeout() const override { return comm::Millis(5000); }
  void broadcast(const comm::BroadcastOptions& opts) override;
  void barrier(comm::Millis) override {}
  void abort() override;
  bool aborted() const override;

 private:
  FakeWire& wire_;
  int size_;
};

class FakeEngine final : public EngineApi {
 public:
  FakeEngine(std::string url, FakeWire& wire, int rank_count = 1);

  // Makes `route` ("POST /begin_weight_update", ...) fail from its `after`-th call (0-based):
  // status 0 = unreachable.
  void fail_route(const std::string& route, int status, int after = 0);
  void clear_failures();
  // Most bucket requests this engine had open at once.
  int max_open_buckets() const;
  void set_selectors(std::vector<Selector> selectors) { info_.selectors = std::move(selectors); }
  // What the engine answers as the session selector in begin (default: what it was asked).
  void set_begin_answer(Selector selector) { begin_answer_ = selector; }
  void set_version(std::string version) { info_.weight_version = std::move(version); }
  // Whether begin and end answer a runner digest ("fake-<weight_version>"), and in an adapter
  // session the held adapter's ("fake-lora-<its version>"), which lets the updater name a delta
  // base (the fake decodes no delta bucket: test the session, not a send).
  void set_runner_digests(bool on) { runner_digests_ = on; }
  // Whether /server_info says the engine takes adapter sessions (docs/lora.md).
  void set_lora(bool lora) { info_.lora = lora; }
  // The adapter committed under `name` (tensor name -> bytes) and its version; empty if none.
  std::map<std::string, std::vector<std::byte>> adapter(const std::string& name) const;
  std::string adapter_version(const std::string& name) const;
  // Drops the adapter `name` as POST /unload_lora_adapter would.
  void drop_adapter(const std::string& name);
  // The last begin's "lora" object (nullopt: a base session).
  std::optional<LoraBegin> last_lora() const;

  // Committed tensors (name -> bytes) and version.
  std::map<std::string, std::vector<std::byte>> committed() const;
  std::string version() const;
  std::vector<UpdateWeightsFromDistributedRequest> bucket_requests() const;

  const std::string& url() const override { return url_; }
  WEIGHTCAST_ENGINE_API_ROUTE_OVERRIDES;

  std::vector<InitWeightsUpdateGroupRequest> inits;  // guarded by mu_

 private:
  void enter(const std::string& route, const std::string& detail = "");

  std::string url_;
  FakeWire& wire_;
  mutable std::mutex mu_;
  ServerInfoResponse info_;
  std::optional<Selector> begin_answer_;
  std::map<std::string, std::pair<int, int>> failures_;  // route -> (status, after)
  std::map<std::string, int> calls_;
  void check_owner(const std::optional<std::string>& id, const char* route) const;
  std::optional<Selector> session_;
  std::string session_token_;  // what begin answered; later session calls must carry it
  int sessions_opened_ = 0;
  std::size_t base_ = 0;  // wire index of this session's bucket 0
  std::map<std::string, std::vector<std::byte>> staged_, committed_;
  std::optional<std::string> staged_version_;
  std::optional<LoraBegin> lora_;  // the open session's, or the last one's
  bool adapter_session_ = false;
  bool runner_digests_ = false;
  std::map<std::string, std::map<std::string, std::vector<std::byte>>> adapters_;
  std::map<std::string, std::string> adapter_versions_;
  std::vector<UpdateWeightsFromDistributedRequest> requests_;
  int open_buckets_ = 0;
  int max_open_buckets_ = 0;
};

// Points `options` at the fake data plane: a FakeCommunicator on `wire` for every group (a new
// group after a failed update is healthy again), 4 KiB buckets and a failure grace of 2 s.
void use_fake_data_plane(UpdaterOptions& options, FakeWire& wire);

// The URLs of the fake engines of the updater tests: engine a, b and c, in FakeFleet's order.
inline constexpr const char* kA = "http://engine-a:1";
inline constexpr const char* kB = "http://engine-b:2";
inline constexpr const char* kC = "http://engine-c:3";

// A DistributedUpdater (with `options`, on the fake data plane of `wire`) over fake engines:
// engine i at the i-th URL of kA, kB, kC with rank_counts[i] ranks (at most three).
struct FakeFleet {
  FakeFleet(const std::vector<int>& rank_counts, UpdaterOptions options);

  FakeWire wire;
  std::vector<FakeEngine*> engines;  // owned by `updater`, in URL order
  std::unique_ptr<DistributedUpdater> updater;
};

}  // namespace weightcast::sync::trainer::testing
