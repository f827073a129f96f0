// C10dStore against C10dStoreServer in both torch generations: round trips, torch's COMPARE_SET
// and ADD semantics, WAIT answered asynchronously (and cancelled, 2.x), the 2.x-only calls,
// wait_for_workers, and the server under raw-socket peers: garbage, oversized claims and stalled
// requests drop only that connection, idle ones stay. The behaviour every Store shares is in
// store_conformance_test.cc.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <future>
#include <thread>

#include "comm/errors.h"
#include "comm/store/c10d_protocol.h"
#include "comm/store/c10d_store.h"
#include "comm/store/c10d_store_server.h"
#include "comm/transport/socket_io.h"
#include "tests/support/time_bounds.h"

namespace weightcast::comm {
namespace {

using namespace std::chrono_literals;
using namespace std::string_literals;

C10dStoreOptions client_options(const C10dStoreServer& server, C10dProtocol protocol) {
  C10dStoreOptions o;
  o.port = server.port();
  o.protocol = protocol;
  o.connect_timeout = 5s;
  return o;
}

class C10dStoreTest : public ::testing::TestWithParam<C10dProtocol> {
 protected:
  std::unique_ptr<C10dStore> client() {
    return std::make_unique<C10dStore>(client_options(server_, GetParam()));
  }
  C10dStoreServer server_{C10dStoreServerOptions{}};
};

TEST_P(C10dStoreTest, RoundTripsWithTorchKeysOnTheWire) {
  auto c = client();
  EXPECT_EQ(c->protocol(), GetParam());
  c->set("a", "1", 1s);
  EXPECT_EQ(c->get("a", 1s), "1");
  EXPECT_EQ(c->add("n", 5, 1s), 5);
  EXPECT_EQ(c->add("n", -7, 1s), -2);
  EXPECT_EQ(c->get("n", 1s), "-2");  // counters are ASCII decimal, as torch stores them
  EXPECT_EQ(c->join_as_worker(1s), 1);
  EXPECT_TRUE(c->check("a", 1s));
  EXPECT_FALSE(c->check("b", 1s));
  EXPECT_EQ(c->num_keys(1s), 3);
  EXPECT_EQ(server_.keys(), (std::vector<std::string>{"/a", "/n", "init/"}));
  EXPECT_TRUE(c->delete_key("a", 1s));
  EXPECT_FALSE(c->delete_key("a", 1s));
  EXPECT_EQ(c->num_keys(1s), 2);
  const auto st = server_.stats();
  EXPECT_EQ(GetParam() == C10dProtocol::kTorch1 ? st.torch1_connections : st.torch2_connections,
            1u);
}

// INTEROP.md section 1: torch's server semantics, including the "lie" for a missing key.
TEST_P(C10dStoreTest, CompareSetFollowsTorch) {
  auto c = client();
  EXPECT_EQ(c->compare_set("k", "x", "y", 1s), "x");  // missing, expected non-empty: nothing
  EXPECT_FALSE(c->check("k", 1s));
  EXPECT_EQ(c->compare_set("k", "", "first", 1s), "first");   // missing, expected empty: created
  EXPECT_EQ(c->compare_set("k", "wrong", "z", 1s), "first");  // mismatch: unchanged
  EXPECT_EQ(c->compare_set("k", "first", "second", 1s), "second");
  EXPECT_EQ(c->get("k", 1s), "second");
}

TEST_P(C10dStoreTest, WaitIsAnsweredWhenAnotherConnectionSets) {
  auto waiter = client();
  auto setter = client();
  auto got = std::async(std::launch::async, [&] { return waiter->get("late", 10s); });
  // The waiting connection blocks nobody: the setter's own round trips go through meanwhile.
  std::this_thread::sleep_for(100ms);
  setter->set("other", "x", 1s);
  EXPECT_EQ(setter->get("other", 1s), "x");
  EXPECT_EQ(got.wait_for(0ms), std::future_status::timeout);
  setter->set("late", "arrived", 1s);
  EXPECT_EQ(got.get(), "arrived");
}

TEST_P(C10dStoreTest, WaitTimeoutNamesMissingKeysAndTheClientCarriesOn) {
  auto c = client();
  c->set("here", "1", 1s);
  const auto start = std::chrono::steady_clock::now();
  try {
    c->wait({"here", "gone"}, 300ms);
    FAIL() << "wait returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'gone'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("'here'"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, weightcast::testing::late_bound(300ms));
  // 2.x cancelled its wait; 1.x reconnects. Either way a later set of "gone" must not confuse it.
  c->set("gone", "now", 1s);
  EXPECT_EQ(c->get("gone", 1s), "now");
  EXPECT_EQ(c->add("n", 1, 1s), 1);
}

// torch has no error reply: a refused ADD costs the connection, and the next call reconnects.
TEST_P(C10dStoreTest, RefusedAddDropsTheConnectionAndTheClientRecovers) {
  auto c = client();
  c->set("text", "not a number", 1s);
  EXPECT_THROW(c->add("text", 1, 1s), PeerError);
  EXPECT_EQ(c->get("text", 1s), "not a number");
  c->add("big", INT64_MAX, 1s);
  EXPECT_THROW(c->add("big", 1, 1s), PeerError);
  EXPECT_EQ(c->add("big", 0, 1s), INT64_MAX);
  EXPECT_EQ(server_.stats().rejected_frames, 2u);
}

INSTANTIATE_TEST_SUITE_P(Generations, C10dStoreTest,
                         ::testing::Values(C10dProtocol::kTorch1, C10dProtocol::kTorch2),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(C10dStore2Test, MultiGetMultiSetAppend) {
  C10dStoreServer server({});
  C10dStore c(client_options(server, C10dProtocol::kTorch2));
  c.multi_set({"a", "b"}, {"1", "2"}, 1s);
  EXPECT_EQ(c.multi_get({"b", "a"}, 1s), (std::vector<std::string>{"2", "1"}));
  c.append("a", "+x", 1s);
  c.append("fresh", "y", 1s);
  EXPECT_EQ(c.multi_get({"a", "fresh"}, 1s), (std::vector<std::string>{"1+x", "y"}));
  EXPECT_THROW(c.multi_get({"a", "never"}, 200ms), TimeoutError);  // waits first, as torch
  EXPECT_THROW(c.multi_set({"a"}, {}, 1s), EnforceError);
}

TEST(C10dStore2Test, OneXConnectionsRefuseTwoXOnlyCalls) {
  C10dStoreServer server({});
  C10dStore c(client_options(server, C10dProtocol::kTorch1));
  EXPECT_THROW(c.multi_get({"a"}, 1s), ConfigError);
  EXPECT_THROW(c.multi_set({"a"}, {"1"}, 1s), ConfigError);
  EXPECT_THROW(c.append("a", "1", 1s), ConfigError);
}

TEST(C10dStoreServerTest, AutoDetectsOneXOnAWeightcastServer) {
  C10dStoreServer server({});
  C10dStore c(client_options(server, C10dProtocol::kAuto));
  EXPECT_EQ(c.protocol(), C10dProtocol::kTorch1);
  c.set("a", "b", 1s);
  EXPECT_EQ(c.get("a", 1s), "b");
}

TEST(C10dStoreServerTest, WaitForWorkersCountsInitAdds) {
  C10dStoreServer server({});
  C10dStore one(client_options(server, C10dProtocol::kTorch1));
  C10dStore two(client_options(server, C10dProtocol::kTorch2));
  EXPECT_EQ(one.join_as_worker(1s), 1);
  auto waiting = std::async(std::launch::async, [&] { server.wait_for_workers(2, 10s); });
  EXPECT_EQ(waiting.wait_for(100ms), std::future_status::timeout);
  EXPECT_EQ(two.join_as_worker(1s), 2);
  waiting.get();
  try {
    server.wait_for_workers(3, 200ms);
    FAIL() << "three workers never joined";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("2/3"), std::string::npos) << e.what();
  }
}

// A raw connection to the server, for peers that do not follow the protocol.
net::Fd raw_connect(const C10dStoreServer& server) {
  std::string error;
  bool timed_out = false;
  net::Fd fd =
      net::connect_once("127.0.0.1", server.port(), deadline_after(2s), &error, &timed_out);
  EXPECT_TRUE(fd.valid()) << error;
  return fd;
}

// True when the server closes `fd` within `timeout` (EOF or reset).
bool closed_by_server(int fd, Millis timeout) {
  char buf[64];
  while (true) {
    auto r = net::recv_exact(fd, buf, 1, deadline_after(timeout));
    if (r.io == net::Io::kClosed || r.io == net::Io::kError) return true;
    if (r.io == net::Io::kTimeout) return false;
  }
}

TEST(C10dStoreServerTest, GarbageOversizedAndUnknownDropOnlyThatConnection) {
  C10dStoreServer server({});
  C10dStore good(client_options(server, C10dProtocol::kTorch2));
  good.set("k", "v", 1s);
  const std::vector<std::string> bad = {
      "\xff garbage"s,                                       // unknown 1.x query byte
      "\x00\xCE\xF7\x85\x3C\x0E"s,                           // 2.x, then unknown byte 14
      "\x00\xCE\xF7\x85\x3C\x00\xCE\xF7\x85\x3C"s,           // 2.x VALIDATE twice
      "\x00\xCE\xF7\x85\x3C\x0D"s + std::string(1, '\x01'),  // fine so far: half-sent PING
      "\x02\xff\xff\xff\xff\xff\xff\xff\x7f"s,               // 1.x GET of a 2^63-byte key
      "\x00\x02\0\0\0\0\0\0\0/k\0\0\0\x10\0\0\0\0"s,         // 1.x SET of a 256 MiB value
      "\x05\0\0\0\0\0\0\x01\0"s,                             // 1.x WAIT on 2^48 keys
      "\x07\x01\0\0\0\0\0\0\0k"s,                            // 1.x WATCH_KEY: not served
  };
  std::uint64_t expected_rejects = 0;
  for (std::size_t i = 0; i < bad.size(); ++i) {
    net::Fd fd = raw_connect(server);
    ASSERT_TRUE(net::send_all(fd.get(), bad[i], deadline_after(1s)).ok());
    const bool half_sent = i == 3;
    EXPECT_EQ(closed_by_server(fd.get(), 1s), !half_sent) << "case " << i;
    if (!half_sent) ++expected_rejects;
    EXPECT_EQ(good.get("k", 1s), "v") << "case " << i;
  }
  EXPECT_EQ(server.stats().rejected_frames, expected_rejects);
}

TEST(C10dStoreServerTest, HalfSentRequestsAreDroppedAfterIoTimeoutIdleOnesStay) {
  C10dStoreServerOptions opts;
  opts.io_timeout = 300ms;
  C10dStoreServer server(opts);
  net::Fd idle = raw_connect(server);
  net::Fd stalled = raw_connect(server);
  ASSERT_TRUE(net::send_all(stalled.get(), "\x00\x02\0\0"s, deadline_after(1s)).ok());
  EXPECT_TRUE(closed_by_server(stalled.get(), 3s));
  EXPECT_FALSE(closed_by_server(idle.get(), 600ms));  // torch 1.x's idle callback socket
  EXPECT_EQ(server.stats().dropped_stalled, 1u);
  // The idle one still works when it finally speaks (1.x GETNUMKEYS).
  ASSERT_TRUE(net::send_all(idle.get(), "\x06"s, deadline_after(1s)).ok());
  char reply[8];
  ASSERT_TRUE(net::recv_exact(idle.get(), reply, 8, deadline_after(1s)).ok());
  EXPECT_EQ(c10d_protocol::read_i64(reply), 0);
}

TEST(C10dStoreServerTest, SizeLimitsHoldOnBothSides) {
  C10dStoreServerOptions opts;
  opts.max_value_bytes = 1024;
  opts.max_request_bytes = 16384;
  C10dStoreServer server(opts);
  auto copts = client_options(server, C10dProtocol::kTorch2);
  copts.max_value_bytes = 1024;
  C10dStore small(copts);
  EXPECT_THROW(small.set("v", std::string(1025, 'x'), 1s), BadRequestError);
  small.set("v", std::string(1024, 'x'), 1s);
  EXPECT_EQ(small.get("v", 1s).size(), 1024u);
  // A client that allows more is cut off by the server, which keeps serving the others.
  copts.max_value_bytes = 8192;
  C10dStore big(copts);
  big.set("w", std::string(2048, 'x'), 1s);
  EXPECT_THROW(big.get("w", 300ms), Error);
  EXPECT_EQ(server.stats().rejected_frames, 1u);
  EXPECT_EQ(small.get("v", 1s).size(), 1024u);
  EXPECT_THROW(C10dStoreServer({.max_request_bytes = 100}), ConfigError);
}

TEST(C10dStoreServerTest, ConnectTimesOutWhenNothingAnswers) {
  // A bound socket that never listens refuses connections; keeping it reserves the port.
  net::Fd reserved(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(reserved.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(reserved.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  for (auto protocol : {C10dProtocol::kTorch1, C10dProtocol::kTorch2, C10dProtocol::kAuto}) {
    C10dStoreOptions o;
    o.port = ntohs(addr.sin_port);
    o.protocol = protocol;
    o.connect_timeout = 300ms;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(C10dStore{o}, TimeoutError) << to_string(protocol);
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              weightcast::testing::late_bound(o.connect_timeout));
  }
  EXPECT_THROW(C10dStore(C10dStoreOptions{}), ConfigError);  // port 0
}

TEST(C10dStoreServerTest, AutoGivesUpOnAListenerThatNeverAnswers) {
  // Accepted by the kernel (backlog) but never read: neither generation's handshake answers.
  std::uint16_t port = 0;
  std::string error;
  net::Fd mute = net::listen_on("127.0.0.1", 0, &port, &error);
  ASSERT_TRUE(mute.valid()) << error;
  C10dStoreOptions o;
  o.port = port;
  o.connect_timeout = 1500ms;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(C10dStore{o}, TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            weightcast::testing::late_bound(o.connect_timeout));
}

}  // namespace
}  // namespace weightcast::comm
