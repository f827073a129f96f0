// The colocated path through the engine's HTTP routes: POST /update_weights_from_tensor with
// weightcast's segment manifest. An in-process "trainer" lays the bucket out in a sealed memfd
// (comm/colocate/segment.h) and serves its read-only descriptor on an abstract unix socket with
// the session's token; the engine copies and hashes it into staging, and end_weight_update
// commits it like any bucket. Refusals (a pickled body, a foreign token, a wrong size, an
// out-of-range manifest, bytes whose digest differs) answer 400 and change nothing.
#include <atomic>
#include <cstring>
#include <thread>

#include "comm/colocate/handle_exchange.h"
#include "comm/colocate/segment.h"
#include "comm/colocate/segment_server.h"
#include "tests/sync/engine/colocate_util.h"
#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

// One bucket in a shared segment, served once by the trainer's SegmentServer with `token`.
class SegmentServer {
 public:
  SegmentServer(const std::vector<RawTensor>& tensors, std::size_t slack = 0)
      : segment_(total(tensors) + slack) {
    std::size_t at = 0;
    for (const auto& t : tensors) {
      std::memcpy(segment_.bytes().data() + at, t.bytes.data(), t.bytes.size());
      offsets_.push_back(at);
      at += t.bytes.size();
    }
  }
  ~SegmentServer() {
    if (thread_.joinable()) thread_.join();
  }

  // Answers the next connection with the descriptor, under `token` and announcing `size`.
  void serve(const std::string& token, std::size_t size) {
    thread_ = std::thread([this, token, size] {
      try {
        server_.serve(token, segment_.reader_fd(), size, 1,
                      comm::deadline_after(std::chrono::seconds(10)));
      } catch (const comm::Error& e) {
        ADD_FAILURE() << e.what();
      }
    });
  }
  void serve(const std::string& token) { serve(token, segment_.size()); }

  // The request body: weightcast's manifest form for `tensors` in this segment.
  std::string body(const std::vector<RawTensor>& tensors, const std::string& session_id,
                   Selector selector = Selector::kTarget) const {
    return segment_body(tensors, offsets_, server_.name(), segment_.size(), session_id, selector);
  }

 private:
  static std::size_t total(const std::vector<RawTensor>& tensors) {
    std::size_t n = 0;
    for (const auto& t : tensors) n += t.bytes.size();
    return n;
  }

  comm::colocate::SharedSegment segment_;
  comm::colocate::SegmentServer server_;
  std::vector<std::size_t> offsets_;
  std::thread thread_;
};

class ColocateRoute : public EngineHttpFixture {
 protected:
  // An owned session (the holder keeps its lease from one begin to the next).
  std::string begin(Selector selector) {
    Json request{{"selector", std::string(to_string(selector))}, {"holder", "trainer"}};
    if (!lease_id_.empty()) request["lease_id"] = lease_id_;
    auto [st, body] = post("/begin_weight_update", request.dump());
    EXPECT_EQ(st, 200) << body.dump();
    lease_id_ = body.value("lease_id", lease_id_);
    return body.value("session_id", "");
  }
  int end(const std::string& session_id) {
    auto [st, body] = post("/end_weight_update", Json{{"session_id", session_id}}.dump());
    EXPECT_EQ(st, 200) << body.dump();
    return st;
  }

  std::string lease_id_;
  // A refused request: 400 naming `words`, and the engine exactly as before.
  void refused(const std::string& body, const std::string& words) {
    const Snapshot before = snapshot();
    auto [st, answer] = post("/update_weights_from_tensor", body);
    EXPECT_EQ(st, 400) << answer.dump();
    EXPECT_NE(answer.value("message", "").find(words), std::string::npos) << answer.dump();
    EXPECT_EQ(snapshot(), before);
  }
  // After refusals: the session is still open, takes `tensors` from `server` and commits them.
  void takes_the_bucket_afterwards(SegmentServer& server, const std::vector<RawTensor>& tensors,
                                   const std::string& session) {
    server.serve(session);
    auto [st, answer] = post("/update_weights_from_tensor", server.body(tensors, session));
    ASSERT_EQ(st, 200) << answer.dump();
    ASSERT_EQ(end(session), 200);
    EXPECT_EQ(snapshot().target_digest, to_string(expected_combined(tensors, Layout::kShuffle)));
  }
};

TEST_F(ColocateRoute, StagesAndCommitsTheTargetOnlyLeavingTheDraftUntouched) {
  const std::size_t shm_before = shm_entries();
  start({}, "", /*ranks=*/2);
  const Snapshot before = snapshot();
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const auto next = target_weights(step);
    SegmentServer server(next);
    const std::string session = begin(Selector::kTarget);
    server.serve(session);
    Json body = Json::parse(server.body(next, session));
    body["weight_version"] = "v" + std::to_string(step);
    auto [st, answer] = post("/update_weights_from_tensor", body.dump());
    ASSERT_EQ(st, 200) << answer.dump();
    ASSERT_EQ(end(session), 200);
    const Snapshot after = snapshot();
    EXPECT_EQ(after.target_digest, to_string(expected_combined(next, Layout::kShuffle)));
    EXPECT_EQ(after.draft_digest, before.draft_digest) << "after update " << step;
    EXPECT_EQ(after.weight_version, "v" + std::to_string(step));
  }
  // The copies count as received bytes, as a group's broadcasts do: three updates of the target.
  std::size_t sent = 0;
  for (const auto& t : target_weights(1)) sent += t.bytes.size();
  const std::string metrics = http().get("/metrics").text;
  const std::string key = "\nweightcast_engine_bytes_received_total ";
  const auto at = metrics.find(key);
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_EQ(std::stoull(metrics.substr(at + key.size())), 3 * sent) << metrics;
  EXPECT_EQ(shm_entries(), shm_before) << "a segment left a name in /dev/shm";
}

TEST_F(ColocateRoute, PickledAndUnknownFormsAre400sThatSayWhatToSend) {
  start();
  const std::string session = begin(Selector::kTarget);
  refused(R"({"serialized_named_tensors": ["gASV"], "load_format": "flattened_bucket"})",
          "unpickling runs code");
  refused(R"({"load_format": "flattened_bucket", "named_tensors": []})", "weightcast_segment");
  EXPECT_FALSE(session.empty());
}

TEST_F(ColocateRoute, ForgedHandlesWrongSizesAndBadManifestsChangeNothing) {
  start();
  const auto next = target_weights(1);
  const std::string session = begin(Selector::kTarget);
  {
    SegmentServer foreign(next);
    foreign.serve("0123456789abcdef0123456789abcdef");  // not this session's token
    refused(foreign.body(next, session), "token");
  }
  {
    SegmentServer wrong_size(next, /*slack=*/4096);
    wrong_size.serve(session, 4096);  // announces a size the segment does not have
    refused(wrong_size.body(next, session), "segment");
  }
  {
    SegmentServer nobody(next);
    Json body = Json::parse(nobody.body(next, session));
    body["segment"]["socket"] = "weightcast-test-nobody-listens-here";
    refused(body.dump(), "no trainer serves");
  }
  {
    SegmentServer server(next);
    Json body = Json::parse(server.body(next, session));
    body["manifest"][1]["offset"] = body["segment"]["size"].get<std::uint64_t>() - 8;
    refused(body.dump(), "outside the segment");
    body = Json::parse(server.body(next, session));
    body["manifest"][1]["offset"] = 4;
    refused(body.dump(), "overlaps");
  }
  {
    SegmentServer server(next);
    server.serve(session);
    Json body = Json::parse(server.body(next, session));
    body["digests"][0] = to_string(tensor_digest(next[1].bytes));
    refused(body.dump(), "trainer sent");
  }
  SegmentServer server(next);
  takes_the_bucket_afterwards(server, next, session);
}

// A device segment's handle (segment.cuda_ipc, docs/colocated.md "On GPUs"): malformed, or named
// beside a socket, is a 400 before anything is opened; a well-formed handle this process cannot
// open (no CUDA device here, or a forged one on a GPU) is a 400 naming the field, and the session
// still takes a bucket afterwards. The device case itself: NcclColocateCudaE2E.
TEST_F(ColocateRoute, CudaHandlesThatCannotBeOpenedAre400sAndChangeNothing) {
  start();
  const auto next = target_weights(1);
  const std::string session = begin(Selector::kTarget);
  SegmentServer server(next);
  Json body = Json::parse(server.body(next, session));
  body["segment"]["cuda_ipc"] = std::string(128, 'a');
  refused(body.dump(), "exactly one of socket");
  body["segment"].erase("socket");
  body["segment"]["cuda_ipc"] = "abc";
  refused(body.dump(), "segment.cuda_ipc: a CUDA IPC handle is 128 hex digits");
  body["segment"]["cuda_ipc"] = std::string(128, '7');
  refused(body.dump(), "segment.cuda_ipc: ");
  takes_the_bucket_afterwards(server, next, session);
}

TEST_F(ColocateRoute, ABucketForAnotherScopeOrWithoutTheOwnersIdIsRefused) {
  start();
  const auto next = target_weights(1);
  const std::string session = begin(Selector::kTarget);
  SegmentServer server(next);
  const Snapshot before = snapshot();
  auto [st, answer] =
      post("/update_weights_from_tensor", server.body(next, session, Selector::kAll));
  EXPECT_EQ(st, 409) << answer.dump();
  Json anonymous = Json::parse(server.body(next, session));
  anonymous.erase("session_id");
  std::tie(st, answer) = post("/update_weights_from_tensor", anonymous.dump());
  EXPECT_EQ(st, 409) << answer.dump();
  EXPECT_EQ(snapshot(), before);
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
