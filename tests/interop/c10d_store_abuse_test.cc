// C10dStoreServer under the abuses a torch-facing store invites, each on raw 2.x connections while
// a real torch worker (c10d_store_worker.py, Debian's torch 1.13) keeps doing rendezvous rounds on
// its own connection:
//   - MULTI_GET amplification: 131,072 keys naming one 8 MiB value (a 1.4 MB request, a 1 TiB
//   reply);
//   - pipelined GETs of that value in one read, from a client that never reads its replies;
//   - APPEND growing a value past the value cap, SETs past the store's byte cap, keys past its key
//   cap;
//   - 512 connections, each holding a partial request.
// Each is refused by dropping only the abusing connection (torch's protocol has no error reply),
// the torch worker finishes its next round, and the process's resident memory stays under the
// caps the server was given. Skips, with the reason, where no interpreter imports torch.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/c10d_protocol.h"
#include "comm/store/c10d_store.h"
#include "comm/store/c10d_store_server.h"
#include "comm/transport/socket_io.h"
#include "tests/support/subprocess.h"
#include "tests/support/time_bounds.h"

namespace weightcast::comm {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;
namespace proto = c10d_protocol;

constexpr auto kLine = 60s;  // torch's import alone takes seconds on a loaded machine
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr int kRounds = 6;

std::size_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::string(field).size()));
  }
  return 0;
}
std::size_t resident_bytes() {
  return status_kib("VmRSS:") * 1024;
}

C10dStoreServerOptions capped() {
  C10dStoreServerOptions o;
  o.io_timeout = 2s;
  o.max_store_bytes = 32 * kMiB;
  o.max_keys = 4096;
  o.max_buffered_bytes = 24 * kMiB;
  return o;
}

// What the server may hold under capped(): its store, its shared buffer budget, each connection's
// free 64 KiB (twice: a string's capacity may double), plus the threads, the test's own buffers
// (about 20 MiB: the 8 MiB value, requests, replies read back) and allocator slack. Without the
// caps the MULTI_GET alone would ask for 1 TiB and the pipelined GETs for 40 GiB.
std::size_t rss_cap() {
  const auto o = capped();
  return o.max_store_bytes + o.max_buffered_bytes + o.max_connections * 2 * (64u << 10) + 96 * kMiB;
}

std::string encode(proto::Request r) {
  return proto::encode_request(proto::Generation::kTorch2, r);
}
proto::Request request(proto::Query q, std::vector<std::string> keys,
                       std::vector<std::string> values = {}) {
  proto::Request r;
  r.query = q;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

// A raw torch 2.x connection (VALIDATE sent), for requests no well-behaved client sends.
net::Fd raw_connection(std::uint16_t port) {
  std::string error;
  bool timed_out = false;
  net::Fd fd = net::connect_once("127.0.0.1", port, deadline_after(5s), &error, &timed_out);
  EXPECT_TRUE(fd.valid()) << error;
  if (!fd) return fd;
  proto::Request validate;
  validate.query = proto::Query::kValidate;
  validate.word = proto::kValidateMagic;
  EXPECT_TRUE(net::send_all(fd.get(), encode(validate), deadline_after(5s)).ok());
  return fd;
}

// Reads and discards until the server closes the connection (true) or `limit` passes.
bool closed_within(int fd, std::chrono::milliseconds limit) {
  const Deadline deadline = deadline_after(limit);
  std::string sink(1 << 20, '\0');
  while (!expired(deadline)) {
    const auto r = net::wait_readable(fd, deadline);
    if (!r.ok()) return false;
    const ssize_t n = ::recv(fd, sink.data(), sink.size(), 0);
    if (n == 0) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return true;  // reset
  }
  return false;
}

class C10dStoreAbuse : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(WEIGHTCAST_TORCH_PYTHON).empty()) {
      GTEST_SKIP() << "no Python interpreter imports torch (WEIGHTCAST_TORCH_PYTHON is empty)";
    }
    C10dStoreOptions o;
    o.port = server_.port();
    o.protocol = C10dProtocol::kTorch1;
    wc_ = std::make_unique<C10dStore>(o);
    ASSERT_EQ(wc_->join_as_worker(5s), 1);
    worker_ = std::make_unique<Subprocess>(
        std::vector<std::string>{WEIGHTCAST_TORCH_PYTHON, "-u",
                                 std::string(WEIGHTCAST_INTEROP_DIR) + "/c10d_store_worker.py",
                                 std::to_string(server_.port()), std::to_string(kRounds)});
    server_.wait_for_workers(2, kLine);
    ASSERT_TRUE(worker_->wait_for_line("JOINED", kLine)) << worker_->output();
  }

  // The torch worker does round `i` and reports the counter it reached.
  void expect_torch_round(int i, const std::string& after) {
    wc_->set("go/" + std::to_string(i), "go" + std::to_string(i), 5s);
    const auto line = worker_->wait_for_line("ROUND " + std::to_string(i) + " ", kLine);
    ASSERT_TRUE(line) << "torch stopped working after " << after << ":\n" << worker_->output();
    EXPECT_EQ(*line, std::to_string(i + 1) + " go" + std::to_string(i) + " True") << after;
  }

  // Waits (bounded) until the server has dropped `more` connections over a cap since `before`.
  bool dropped_over_cap(std::uint64_t before, std::uint64_t more, std::chrono::milliseconds limit) {
    const Deadline deadline = deadline_after(limit);
    while (!expired(deadline)) {
      if (server_.stats().dropped_over_cap >= before + more) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  void expect_rss_under_cap(const std::string& after) {
    EXPECT_LT(resident_bytes(), rss_base_ + rss_cap())
        << "after " << after << ": " << resident_bytes() / kMiB << " MiB resident, started at "
        << rss_base_ / kMiB << " MiB, cap " << rss_cap() / kMiB << " MiB";
  }

  // Seeds the 8 MiB value "big" and waits until the server holds it.
  void put_big_value() {
    net::Fd setter = raw_connection(server_.port());
    ASSERT_TRUE(net::send_all(setter.get(), encode(request(proto::Query::kSet, {"big"}, {big_})),
                              deadline_after(10s))
                    .ok());
    proto::Request ping;
    ping.query = proto::Query::kPing;
    ping.word = 7;
    ASSERT_TRUE(net::send_all(setter.get(), encode(ping), deadline_after(5s)).ok());
    char echo[4];
    ASSERT_TRUE(net::recv_exact(setter.get(), echo, 4, deadline_after(10s)).ok());  // SET is in
  }

  // MULTI_GET amplification: refused as soon as its reply passes the request cap.
  void abuse_multi_get() {
    const auto before = server_.stats().dropped_over_cap;
    net::Fd fd = raw_connection(server_.port());
    const std::string multi =
        encode(request(proto::Query::kMultiGet, std::vector<std::string>(128u << 10, "big")));
    ASSERT_LT(multi.size(), 2 * kMiB);
    (void)net::send_all(fd.get(), multi, deadline_after(10s));
    EXPECT_TRUE(dropped_over_cap(before, 1, testing::late_bound(capped().io_timeout)));
    EXPECT_TRUE(closed_within(fd.get(), 10s));
    expect_rss_under_cap("MULTI_GET amplification");
    expect_torch_round(round_++, "MULTI_GET amplification");
  }

  // Pipelined GETs in one read, replies never read: not read further, then dropped.
  void abuse_pipelined_gets() {
    const auto before = server_.stats().dropped_over_cap;
    net::Fd fd = raw_connection(server_.port());
    std::string gets;
    const std::string one = encode(request(proto::Query::kGet, {"big"}));
    while (gets.size() + one.size() <= 64u << 10) gets += one;
    ASSERT_TRUE(net::send_all(fd.get(), gets, deadline_after(5s)).ok());
    EXPECT_TRUE(dropped_over_cap(before, 1, testing::late_bound(capped().io_timeout)))
        << "a client that takes none of " << gets.size() / one.size() << " replies of 8 MiB";
    EXPECT_TRUE(closed_within(fd.get(), 10s));
    expect_rss_under_cap("pipelined GETs");
    expect_torch_round(round_++, "pipelined GETs");
  }

  // APPEND growth: refused at the value cap, and the value stays within it.
  void abuse_append() {
    const auto before = server_.stats().dropped_over_cap;
    net::Fd fd = raw_connection(server_.port());
    const std::string chunk(kMiB, 'a');
    for (int i = 0; i < 12; ++i) {
      if (!net::send_all(fd.get(), encode(request(proto::Query::kAppend, {"/grown"}, {chunk})),
                         deadline_after(5s))
               .ok()) {
        break;
      }
    }
    EXPECT_TRUE(dropped_over_cap(before, 1, 10s));
    EXPECT_TRUE(closed_within(fd.get(), 10s));
    EXPECT_EQ(wc_->get("grown", 5s).size(), capped().max_value_bytes);
    expect_torch_round(round_++, "APPEND growth");
  }

  // The store's byte cap, then its key cap.
  void abuse_store_caps() {
    const auto before = server_.stats().dropped_over_cap;
    net::Fd bytes = raw_connection(server_.port());
    for (int i = 0; i < 8; ++i) {
      const std::string key = "/fill" + std::to_string(i);
      if (!net::send_all(bytes.get(), encode(request(proto::Query::kSet, {key}, {big_})),
                         deadline_after(5s))
               .ok()) {
        break;
      }
    }
    EXPECT_TRUE(dropped_over_cap(before, 1, 10s));
    EXPECT_TRUE(closed_within(bytes.get(), 10s));
    EXPECT_LE(server_.stats().store_bytes, capped().max_store_bytes);
    for (int i = 0; i < 8; ++i) (void)wc_->delete_key("fill" + std::to_string(i), 5s);
    net::Fd keys = raw_connection(server_.port());
    std::vector<std::string> names, values;
    for (int i = 0; i < 5000; ++i) {
      names.push_back("/k" + std::to_string(i));
      values.emplace_back("x");
    }
    (void)net::send_all(keys.get(), encode(request(proto::Query::kMultiSet, names, values)),
                        deadline_after(5s));
    EXPECT_TRUE(dropped_over_cap(before, 2, 10s));
    EXPECT_TRUE(closed_within(keys.get(), 10s));
    EXPECT_LE(wc_->num_keys(5s), static_cast<std::int64_t>(capped().max_keys));
    // The store is full, so torch's round needs room: a well-behaved client frees it.
    for (int i = 0; i < 5000; ++i) (void)wc_->delete_key("k" + std::to_string(i), 5s);
    expect_rss_under_cap("the store's caps");
    expect_torch_round(round_++, "the store's caps");
  }

  // 512 connections, each holding a partial SET that claims an 8 MiB value.
  void abuse_partial_requests() {
    const auto before = server_.stats();
    std::string partial = encode(request(proto::Query::kSet, {"/partial"}, {big_}));
    partial.resize(512u << 10);
    std::vector<net::Fd> held;
    for (int i = 0; i < 512; ++i) {
      held.push_back(raw_connection(server_.port()));
      if (held.back()) (void)net::send_all(held.back().get(), partial, deadline_after(200ms));
    }
    expect_rss_under_cap("512 partial requests");
    expect_torch_round(round_++, "512 partial requests");
    // Past the shared buffer budget some were dropped at once; the rest stall out at io_timeout.
    EXPECT_GT(server_.stats().dropped_over_cap, before.dropped_over_cap);
    const Deadline deadline = deadline_after(testing::late_bound(capped().io_timeout));
    // Both counts: `active` alone can reach its old value while a few of these are still open,
    // when connections of the earlier abuses close in the meantime.
    while ((server_.stats().active > before.active || server_.stats().buffered_bytes > 0) &&
           !expired(deadline)) {
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_LE(server_.stats().active, before.active);
    EXPECT_GT(server_.stats().dropped_stalled, before.dropped_stalled);
    EXPECT_EQ(server_.stats().buffered_bytes, 0u);
  }

  const std::string big_ = std::string(8 * kMiB, 'v');
  int round_ = 0;  // torch rounds so far
  C10dStoreServer server_{capped()};
  std::unique_ptr<C10dStore> wc_;
  std::unique_ptr<Subprocess> worker_;
  std::size_t rss_base_ = 0;
};

TEST_F(C10dStoreAbuse, EachAbuseDropsOnlyItsConnectionWhileTorchKeepsWorking) {
  put_big_value();
  if (HasFatalFailure()) return;
  rss_base_ = resident_bytes();
  expect_torch_round(round_++, "setup");

  abuse_multi_get();
  if (HasFatalFailure()) return;
  abuse_pipelined_gets();
  if (HasFatalFailure()) return;
  abuse_append();
  if (HasFatalFailure()) return;
  abuse_store_caps();
  if (HasFatalFailure()) return;
  abuse_partial_requests();
  if (HasFatalFailure()) return;
  EXPECT_EQ(worker_->wait(kLine), 0) << worker_->output();
  std::printf("resident %zu MiB (peak %zu MiB) from %zu MiB; cap %zu MiB\n",
              resident_bytes() / kMiB, status_kib("VmHWM:") / 1024, rss_base_ / kMiB,
              rss_cap() / kMiB);
}

}  // namespace
}  // namespace weightcast::comm
