#include "tests/sync/trainer/fakes.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>

#include "comm/errors.h"

namespace weightcast::sync::trainer::testing {

void FakeCommunicator::broadcast(const comm::BroadcastOptions& opts) {
  if (wire_.broadcast_delay.count() > 0) std::this_thread::sleep_for(wire_.broadcast_delay);
  std::unique_lock lock(wire_.mu);
  const std::size_t k = wire_.broadcasts.size();
  if (wire_.engines > 0 && k + 1 < wire_.total_buckets) {
    const bool seen = wire_.cv.wait_for(lock, std::chrono::seconds(2), [&] {
      return wire_.aborted || wire_.requests_seen[k + 1] >= wire_.engines;
    });
    if (!seen) ++wire_.missing_lookahead;
  }
  if (wire_.aborted) throw comm::PeerError("fake", "communicator aborted");
  if (wire_.fail_broadcast_at == static_cast<int>(k)) {
    wire_.aborted = true;
    wire_.cv.notify_all();
    throw comm::PeerError("rank 1", "injected broadcast failure");
  }
  const auto* p = static_cast<const std::byte*>(opts.buffer);
  wire_.events.push_back("broadcast " + std::to_string(wire_.broadcasts.size()));
  wire_.broadcasts.emplace_back(p, p + opts.bytes);
  wire_.cv.notify_all();
}

void FakeCommunicator::abort() {
  std::lock_guard lock(wire_.mu);
  wire_.aborted = true;
  wire_.cv.notify_all();
}

bool FakeCommunicator::aborted() const {
  std::lock_guard lock(wire_.mu);
  return wire_.aborted;
}

FakeEngine::FakeEngine(std::string url, FakeWire& wire, int rank_count)
    : url_(std::move(url)), wire_(wire) {
  info_.selectors = {Selector::kAll, Selector::kTarget, Selector::kDraft};
  info_.backends = {Backend::kGloo, Backend::kNccl};
  info_.rank_count = rank_count;
  info_.weight_version = "0";
  info_.runners = {RunnerInfo{Runner::kTarget, {"*"}, "none", 0, std::nullopt}};
}

void FakeEngine::fail_route(const std::string& route, int status, int after) {
  std::lock_guard lock(mu_);
  failures_[route] = {status, after};
}

void FakeEngine::clear_failures() {
  std::lock_guard lock(mu_);
  failures_.clear();
}

int FakeEngine::max_open_buckets() const {
  std::lock_guard lock(mu_);
  return max_open_buckets_;
}

void FakeEngine::enter(const std::string& route, const std::string& detail) {
  wire_.log(url_ + " " + route + (detail.empty() ? "" : " " + detail));
  std::lock_guard lock(mu_);
  const int call = calls_[route]++;
  const auto it = failures_.find(route);
  if (it != failures_.end() && call >= it->second.second) {
    throw EngineError(url_, route, it->second.first, "injected failure");
  }
}

std::map<std::string, std::vector<std::byte>> FakeEngine::committed() const {
  std::lock_guard lock(mu_);
  return committed_;
}

std::string FakeEngine::version() const {
  std::lock_guard lock(mu_);
  return info_.weight_version;
}

std::vector<UpdateWeightsFromDistributedRequest> FakeEngine::bucket_requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

BasicResponse FakeEngine::health() {
  enter("GET /health");
  return {};
}

ServerInfoResponse FakeEngine::server_info() {
  enter("GET /server_info");
  std::lock_guard lock(mu_);
  return info_;
}

BasicResponse FakeEngine::init_weights_update_group(const InitWeightsUpdateGroupRequest& req) {
  enter("POST /init_weights_update_group");
  std::lock_guard lock(mu_);
  inits.push_back(req);
  return {};
}

BasicResponse FakeEngine::destroy_weights_update_group(const DestroyWeightsUpdateGroupRequest&) {
  enter("POST /destroy_weights_update_group");
  return {};
}

BasicResponse FakeEngine::pause_generation(const PauseGenerationRequest&) {
  enter("POST /pause_generation");
  return {};
}

BasicResponse FakeEngine::flush_cache() {
  enter("POST /flush_cache");
  return {};
}

BeginWeightUpdateResponse FakeEngine::begin_weight_update(const BeginWeightUpdateRequest& req) {
  enter("POST /begin_weight_update", std::string(to_string(req.selector)));
  std::lock_guard lock(mu_);
  if (session_) throw EngineError(url_, "POST /begin_weight_update", 409, "already in a session");
  session_ = req.selector;
  session_token_ = "fake-session-" + std::to_string(++sessions_opened_);
  {
    std::lock_guard wire_lock(wire_.mu);
    base_ = wire_.broadcasts.size();
  }
  staged_.clear();
  staged_version_.reset();
  lora_ = req.lora;
  adapter_session_ = req.lora.has_value();
  BeginWeightUpdateResponse out;
  out.selector = begin_answer_.value_or(req.selector);
  out.session_id = session_token_;
  out.holder = req.holder.value_or("");
  out.weight_version = info_.weight_version;
  if (runner_digests_) out.runner_digest = "fake-" + info_.weight_version;
  if (const auto held = lora_ ? adapter_versions_.find(lora_->name) : adapter_versions_.end();
      runner_digests_ && held != adapter_versions_.end()) {
    out.lora_version = held->second;
    out.lora_digest = "fake-lora-" + held->second;
  }
  return out;
}

void FakeEngine::check_owner(const std::optional<std::string>& id, const char* route) const {
  if (session_ && id && *id != session_token_) {
    throw EngineError(url_, route, 409, "session_id '" + *id + "' is not the open session");
  }
}

BasicResponse FakeEngine::update_weights_from_distributed(
    const UpdateWeightsFromDistributedRequest& req) {
  const std::uint64_t sequence = req.sequence.value_or(0);
  enter("POST /update_weights_from_distributed", std::to_string(sequence));
  {
    std::lock_guard lock(wire_.mu);
    ++wire_.requests_seen[sequence];
    wire_.cv.notify_all();
  }
  {
    std::lock_guard lock(mu_);
    max_open_buckets_ = std::max(max_open_buckets_, ++open_buckets_);
  }
  struct Closer {
    FakeEngine* self;
    ~Closer() {
      std::lock_guard lock(self->mu_);
      --self->open_buckets_;
    }
  } closer{this};
  std::size_t index = 0;
  {
    std::lock_guard lock(mu_);
    requests_.push_back(req);
    if (!session_ || *session_ != req.selector) {
      throw EngineError(url_, "POST /update_weights_from_distributed", 409, "selector mismatch");
    }
    check_owner(req.session_id, "POST /update_weights_from_distributed");
    index = base_ + sequence;
  }
  std::vector<std::byte> bytes;
  {
    std::unique_lock lock(wire_.mu);
    const bool arrived = wire_.cv.wait_for(lock, std::chrono::seconds(10), [&] {
      return wire_.aborted || wire_.broadcasts.size() > index;
    });
    if (!arrived || wire_.broadcasts.size() <= index) {
      throw EngineError(url_, "POST /update_weights_from_distributed", 500, "bucket not received");
    }
    bytes = wire_.broadcasts[index];
  }
  const BucketPlan plan = make_bucket(sequence, req.tensors);
  std::lock_guard lock(mu_);
  for (const auto& t : unpack(bytes, plan)) {
    staged_[t.entry->meta.name].assign(t.bytes.begin(), t.bytes.end());
  }
  return {};
}

BasicResponse FakeEngine::update_weight_version(const UpdateWeightVersionRequest& req) {
  enter("POST /update_weight_version", req.new_version);
  std::lock_guard lock(mu_);
  check_owner(req.session_id, "POST /update_weight_version");
  staged_version_ = req.new_version;
  return {};
}

EndWeightUpdateResponse FakeEngine::end_weight_update(const EndWeightUpdateRequest& req) {
  enter("POST /end_weight_update");
  std::lock_guard lock(mu_);
  if (!session_) throw EngineError(url_, "POST /end_weight_update", 409, "no session");
  check_owner(req.session_id, "POST /end_weight_update");
  if (adapter_session_) {
    // An adapter commit swaps the adapter in; the base and its version stay.
    adapters_[lora_->name] = std::move(staged_);
    adapter_versions_[lora_->name] = staged_version_.value_or("");
  } else {
    for (auto& [name, bytes] : staged_) committed_[name] = std::move(bytes);
    if (staged_version_) info_.weight_version = *staged_version_;
  }
  staged_.clear();
  session_.reset();
  EndWeightUpdateResponse out{true, "", info_.weight_version, {}, {}, {}};
  if (runner_digests_) {
    out.runner_digest = "fake-" + info_.weight_version;
    if (adapter_session_) out.lora_digest = "fake-lora-" + adapter_versions_[lora_->name];
  }
  adapter_session_ = false;
  return out;
}

BasicResponse FakeEngine::continue_generation(const ContinueGenerationRequest&) {
  enter("POST /continue_generation");
  return {};
}

BasicResponse FakeEngine::release_lease(const ReleaseLeaseRequest&) {
  enter("POST /release_weight_update_lease");
  return {};
}

BasicResponse FakeEngine::update_weights_from_disk(const std::string& model_path) {
  enter("POST /update_weights_from_disk", model_path);
  return {};
}

BasicResponse FakeEngine::abort_weight_update(const AbortWeightUpdateRequest& req) {
  enter("POST /abort_weight_update");
  std::lock_guard lock(mu_);
  if (!req.force) check_owner(req.session_id, "POST /abort_weight_update");
  session_.reset();
  staged_.clear();
  staged_version_.reset();
  return {};
}

std::map<std::string, std::vector<std::byte>> FakeEngine::adapter(const std::string& name) const {
  std::lock_guard lock(mu_);
  const auto it = adapters_.find(name);
  return it == adapters_.end() ? std::map<std::string, std::vector<std::byte>>{} : it->second;
}

std::string FakeEngine::adapter_version(const std::string& name) const {
  std::lock_guard lock(mu_);
  const auto it = adapter_versions_.find(name);
  return it == adapter_versions_.end() ? std::string() : it->second;
}

void FakeEngine::drop_adapter(const std::string& name) {
  std::lock_guard lock(mu_);
  adapters_.erase(name);
  adapter_versions_.erase(name);
}

std::optional<LoraBegin> FakeEngine::last_lora() const {
  std::lock_guard lock(mu_);
  return lora_;
}

WeightsChecksumResponse FakeEngine::weights_checksum(Runner runner, bool) {
  enter("GET /weights_checksum");
  WeightsChecksumResponse r;
  r.runner = runner;
  std::lock_guard lock(mu_);
  r.weight_version = info_.weight_version;
  return r;
}

// Neither is part of an update; the fake answers them without recording a call.
std::string FakeEngine::metrics() {
  return "";
}

SpecAcceptLengthResponse FakeEngine::spec_accept_length() {
  return {};
}

void use_fake_data_plane(UpdaterOptions& options, FakeWire& wire) {
  options.communicator_factory = [&wire](std::string_view, const comm::CommOptions& o) {
    std::lock_guard lock(wire.mu);
    wire.aborted = false;
    return std::make_unique<FakeCommunicator>(wire, o.size);
  };
  options.buckets.bucket_bytes = 4096;
  options.buckets.failure_grace = comm::Millis(2000);
}

FakeFleet::FakeFleet(const std::vector<int>& rank_counts, UpdaterOptions options) {
  const std::array<const char*, 3> urls = {kA, kB, kC};
  std::vector<std::unique_ptr<EngineApi>> owned;
  for (std::size_t i = 0; i < rank_counts.size(); ++i) {
    auto engine = std::make_unique<FakeEngine>(urls.at(i), wire, rank_counts[i]);
    engines.push_back(engine.get());
    owned.push_back(std::move(engine));
  }
  use_fake_data_plane(options, wire);
  updater = std::make_unique<DistributedUpdater>(std::move(owned), std::move(options));
}

}  // namespace weightcast::sync::trainer::testing
