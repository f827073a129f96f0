// The colocated path between real processes: weightcast-engine, and a "trainer" child process
// that lays a bucket out in a sealed memfd and serves it on an abstract unix socket
// (comm/colocate/segment_server.h) while the test posts /update_weights_from_tensor. A 2-rank
// engine takes three updates of the target with its frozen draft bit-identical; a trainer killed
// while an engine waits for its segment leaves the engine on its version, and nothing is left in
// /dev/shm either way.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/colocate/segment.h"
#include "comm/colocate/segment_server.h"
#include "sync/engine/runners/weights.h"
#include "sync/model/model.h"
#include "tests/sync/engine/colocate_util.h"
#include "tests/sync/engine/process_sender.h"
#include "tests/sync/engine/test_util.h"

namespace weightcast::sync::engine::testing {
namespace {

using Json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

// WEIGHTCAST_ENGINE_BIN (the CMake target's path) names the engine binary.
constexpr std::uint64_t kColocateSeed = 11;

EngineProcess start_engine(int ranks) {
  return start_engine_process(WEIGHTCAST_ENGINE_BIN, ranks, kColocateSeed,
                              {"--init-timeout-ms", "15000", "--comm-timeout-ms", "3000"});
}

std::string runner_digest(Sender& s, const char* runner) {
  return s.get(0, std::string("/weights_checksum?runner=") + runner).body.value("digest", "");
}

std::vector<RawTensor> sent_at(std::uint64_t step) {
  return generate_weights(target_tensors(model_preset("tiny")), kColocateSeed, step);
}

// A trainer process holding one bucket: forked, it lays `tensors` out in a segment, writes the
// socket name on a pipe, and serves the segment to one engine (or, `die_on_connect`, is killed
// by SIGKILL the moment an engine connects). The parent reads the name and builds the request.
class TrainerChild {
 public:
  TrainerChild(const std::vector<RawTensor>& tensors, const std::string& token,
               bool die_on_connect) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      run(tensors, token, die_on_connect, fds[1]);  // never returns
    }
    ::close(fds[1]);
    char buf[256] = {};
    const ssize_t n = ::read(fds[0], buf, sizeof(buf) - 1);
    ::close(fds[0]);
    EXPECT_GT(n, 0) << "the trainer child did not start";
    name_ = std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    std::size_t at = 0;
    for (const auto& t : tensors) {
      offsets_.push_back(at);
      at += t.bytes.size();
    }
    size_ = at;
  }
  ~TrainerChild() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  std::string body(const std::vector<RawTensor>& tensors, const std::string& session) const {
    return segment_body(tensors, offsets_, name_, size_, session);
  }

 private:
  [[noreturn]] static void run(const std::vector<RawTensor>& tensors, const std::string& token,
                               bool die_on_connect, int out) {
    std::size_t total = 0;
    for (const auto& t : tensors) total += t.bytes.size();
    comm::colocate::SharedSegment segment(total);
    std::size_t at = 0;
    for (const auto& t : tensors) {
      std::memcpy(segment.bytes().data() + at, t.bytes.data(), t.bytes.size());
      at += t.bytes.size();
    }
    comm::colocate::SegmentServer server;
    (void)!::write(out, server.name().data(), server.name().size());
    ::close(out);
    if (die_on_connect) {
      // The engine's connection waits in the backlog until the parent kills this process; the
      // handle is never sent.
      for (;;) ::pause();
    }
    try {
      server.serve(token, segment.reader_fd(), total, 1, comm::deadline_after(seconds(30)));
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }

  pid_t pid_ = -1;
  std::string name_;
  std::vector<std::size_t> offsets_;
  std::size_t size_ = 0;

 public:
  pid_t pid() const { return pid_; }
};

std::string begin(Sender& s, const std::string& version_note) {
  auto r = s.post(0, "/begin_weight_update", R"({"selector":"target"})");
  EXPECT_EQ(r.status, 200) << version_note << ": " << r.body.dump();
  return r.body.value("session_id", "");
}

TEST(ColocateProcess, TrainerProcessUpdatesATwoRankEngineAndTheDraftStaysBitIdentical) {
  const std::size_t shm_before = shm_entries();
  auto engine = start_engine(2);
  Sender sender({engine.endpoint}, "weightcast-pp_0", seconds(10));
  const std::string draft_before = runner_digest(sender, "draft");
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const auto sent = sent_at(step);
    const std::string session = begin(sender, "step " + std::to_string(step));
    TrainerChild trainer(sent, session, /*die_on_connect=*/false);
    Json body = Json::parse(trainer.body(sent, session));
    body["weight_version"] = std::to_string(step);
    auto r = sender.post(0, "/update_weights_from_tensor", body.dump());
    ASSERT_EQ(r.status, 200) << r.body.dump();
    r = sender.post(0, "/end_weight_update", Json{{"session_id", session}}.dump());
    ASSERT_EQ(r.status, 200) << r.body.dump();
    auto sum = sender.get(0, "/weights_checksum?runner=target").body;
    std::map<std::string, std::string> held;
    for (const auto& t : sum["tensors"]) held[t["name"]] = t["digest"];
    EXPECT_EQ(held, expected_digests(sent, Layout::kShuffle)) << "step " << step;
    EXPECT_TRUE(sum["ranks_agree"].get<bool>());
    EXPECT_EQ(runner_digest(sender, "draft"), draft_before);
    EXPECT_EQ(sender.get(0, "/server_info").body["weight_version"], std::to_string(step));
  }
  EXPECT_EQ(shm_entries(), shm_before) << "a segment left a name in /dev/shm";
}

TEST(ColocateProcess, ATrainerKilledMidBucketLeavesTheEngineOnItsVersion) {
  const std::size_t shm_before = shm_entries();
  auto engine = start_engine(1);
  Sender sender({engine.endpoint}, "weightcast-pp_0", seconds(10));
  const std::string target_before = runner_digest(sender, "target");
  const Json version_before = sender.get(0, "/server_info").body["weight_version"];
  const auto sent = sent_at(1);
  const std::string session = begin(sender, "killed");
  {
    TrainerChild trainer(sent, session, /*die_on_connect=*/true);
    const std::string body = trainer.body(sent, session);
    auto answer = std::async(std::launch::async,
                             [&] { return sender.post(0, "/update_weights_from_tensor", body); });
    std::this_thread::sleep_for(
        milliseconds(200));  // the engine has connected and waits for the handle
    ::kill(trainer.pid(), SIGKILL);
    const HttpResult r = answer.get();
    EXPECT_EQ(r.status, 400) << r.body.dump();
    EXPECT_NE(r.body.value("message", "").find("segment"), std::string::npos) << r.body.dump();
  }
  EXPECT_EQ(runner_digest(sender, "target"), target_before);
  EXPECT_EQ(sender.get(0, "/server_info").body["weight_version"], version_before);
  EXPECT_EQ(sender.post(0, "/abort_weight_update", Json{{"session_id", session}}.dump()).status,
            200);
  EXPECT_EQ(shm_entries(), shm_before);
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
