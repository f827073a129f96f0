// An Engine with a target (shuffle, "model.*") and a draft (shuffle, "mtp.*") over small
// tensors, served by an in-process HttpServer on an ephemeral port, with a FakeSource as the
// data plane. Snapshot captures everything a refused request must leave unchanged.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sync/engine/control/engine.h"
#include "sync/engine/http/server.h"
#include "sync/model/delta.h"
#include "tests/support/engine_http.h"
#include "tests/sync/engine/fake_channel.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine::testing {

using Json = nlohmann::json;

struct Snapshot {
  bool in_session = false;
  Json session_selector;
  bool paused = false;
  std::string weight_version;
  std::string target_digest;
  std::string draft_digest;
  std::vector<std::string> groups;
  bool operator==(const Snapshot&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const Snapshot& s) {
  os << "{in_session=" << s.in_session << " selector=" << s.session_selector.dump()
     << " paused=" << s.paused << " version=" << s.weight_version << " target=" << s.target_digest
     << " draft=" << s.draft_digest << " groups=[";
  for (const auto& g : s.groups) os << g << ' ';
  return os << "]}";
}

class EngineHttpFixture : public ::testing::Test {
 public:
  static std::vector<RawTensor> target_weights(std::uint64_t step) {
    return {tensor("model.a", {32, 64}, step), tensor("model.b", {16, 96}, step),
            tensor("model.norm", {64}, step)};
  }
  static std::vector<RawTensor> draft_weights() {
    return {tensor("draft.fc", {16, 64}, 0), tensor("draft.norm", {64}, 0)};
  }

  void start(EngineOptions opts = {}, std::string token = "", int ranks = 1) {
    opts.rank_count = ranks;
    opts.connector = source_->connector();
    RunnerConfig target{Runner::kTarget, NameFilter::parse("model.*"), Layout::kShuffle, {}, 0,
                        "generated"};
    RunnerConfig draft{Runner::kDraft, NameFilter::parse("mtp.*"), Layout::kShuffle, {}, 0,
                       "generated"};
    auto runners =
        std::make_unique<RunnerSet>(std::vector<RunnerConfig>{target, draft}, "v0", ranks);
    auto initial = target_weights(0);
    initial.insert(initial.end(), extra_target_.begin(), extra_target_.end());
    runners->load_initial(Runner::kTarget, std::move(initial));
    runners->load_initial(Runner::kDraft, draft_weights());
    engine_ = std::make_unique<Engine>(opts, std::move(runners));
    ServerOptions sopts;
    sopts.token = token;
    sopts.max_body_bytes = 1u << 20;
    server_ = std::make_unique<HttpServer>(engine_routes(*engine_), sopts);
    server_->start();
    token_ = token;
    client_ = make_client();
  }

  // The shared test client (tests/support/engine_http.h) with this engine's token.
  weightcast::testing::EngineHttp http(const std::string& token) const {
    return weightcast::testing::EngineHttp(
        server_->host(), server_->port(),
        {std::chrono::seconds(5), std::chrono::seconds(20), std::chrono::seconds(5)}, token);
  }
  weightcast::testing::EngineHttp http() const { return http(token_); }

  // A raw client, for tests that check methods and headers no typed client sends.
  std::unique_ptr<httplib::Client> make_client() const {
    auto c = std::make_unique<httplib::Client>(server_->host(), server_->port());
    c->set_connection_timeout(std::chrono::seconds(5));
    c->set_read_timeout(std::chrono::seconds(20));
    c->set_write_timeout(std::chrono::seconds(5));
    if (!token_.empty()) c->set_bearer_token_auth(token_.c_str());
    return c;
  }

  void TearDown() override {
    client_.reset();
    if (engine_) engine_->shutdown();
    server_.reset();
    engine_.reset();
  }

  // Status and parsed body; fails the test on a transport error.
  std::pair<int, Json> post(const std::string& path, const std::string& body) {
    return answered(path, http().post(path, body));
  }
  std::pair<int, Json> get(const std::string& path) { return answered(path, http().get(path)); }

  static std::pair<int, Json> answered(const std::string& path,
                                       const weightcast::testing::HttpAnswer& a) {
    EXPECT_NE(a.status, 0) << path << ": " << a.body.dump();
    if (a.status == 0) return {0, Json()};
    return {a.status, a.body};
  }

  Snapshot snapshot() {
    Snapshot s;
    auto [st, info] = get("/server_info");
    EXPECT_EQ(st, 200);
    s.in_session = info.value("in_session", false);
    s.session_selector = info.value("session_selector", Json());
    s.paused = info.value("paused", false);
    s.weight_version = info.value("weight_version", "");
    for (const auto& g : info.value("groups", Json::array())) {
      s.groups.push_back(g.value("group_name", "") + (g.value("aborted", false) ? "(x)" : ""));
    }
    s.target_digest = get("/weights_checksum?runner=target").second.value("digest", "");
    s.draft_digest = get("/weights_checksum?runner=draft").second.value("digest", "");
    return s;
  }

  std::string init_body(const std::string& group) const {
    InitWeightsUpdateGroupRequest r;
    r.master_address = "127.0.0.1";
    r.master_port = 1;  // the fake connector never dials it
    r.rank_offset = 1;
    r.world_size = 1 + engine_->options().rank_count;
    r.group_name = group;
    r.backend = Backend::kGloo;
    return to_json_string(r);
  }

  void join(const std::string& group) {
    auto [st, body] = post("/init_weights_update_group", init_body(group));
    ASSERT_EQ(st, 200) << body.dump();
  }

  // The request for bucket `sequence` holding `tensors`; the bytes are queued on the fake
  // data plane so the engine's receive finds them.
  std::string bucket_body(std::uint64_t sequence, const std::vector<RawTensor>& tensors,
                          Selector selector, const std::string& group = "g",
                          bool queue_bytes = true) {
    if (queue_bytes) source_->broadcast(pack_bucket(sequence, tensors).bytes);
    UpdateWeightsFromDistributedRequest r;
    r.tensors = metas_of(tensors);
    r.group_name = group;
    r.selector = selector;
    r.sequence = sequence;
    return to_json_string(r);
  }

  // The digest of each tensor of `tensors`, as the trainer's packing pass computes them.
  static std::vector<std::string> digests_of(const std::vector<RawTensor>& tensors) {
    const PackedBucket b = pack_bucket(0, tensors);
    std::vector<std::string> out;
    for (const BucketEntry& e : b.plan.entries) {
      out.push_back(to_string(tensor_digest({b.bytes.data() + e.offset, e.bytes})));
    }
    return out;
  }

  // The request for bucket 0 of `next` as a delta against `base` (the bytes the sender believes
  // the engine holds at `base_version`, whose digests ride along), carrying `digests` (those of
  // `next`, or none); the payload is queued on the fake data plane.
  std::string delta_bucket_body(const std::vector<RawTensor>& next,
                                const std::vector<RawTensor>& base, const std::string& base_version,
                                std::vector<std::string> digests = {}) {
    const PackedBucket n = pack_bucket(0, next);
    const PackedBucket b = pack_bucket(0, base);
    DeltaEncoder encoder(kDefaultDeltaCodec);
    std::vector<std::byte> payload;
    EXPECT_TRUE(encoder.encode(n.bytes, b.bytes, 4 * n.bytes.size(), payload));
    BucketDelta delta{kDefaultDeltaCodec, payload.size(), base_version, digests_of(base)};
    source_->broadcast(std::move(payload));
    UpdateWeightsFromDistributedRequest r;
    r.tensors = metas_of(next);
    r.group_name = "g";
    r.selector = Selector::kTarget;
    r.sequence = 0;
    r.delta = std::move(delta);
    r.digests = std::move(digests);
    return to_json_string(r);
  }

  std::shared_ptr<FakeSource> source_ = std::make_shared<FakeSource>();
  std::vector<RawTensor> extra_target_;  // more initial target tensors, set before start()
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
  std::string token_;
};

}  // namespace weightcast::sync::engine::testing
