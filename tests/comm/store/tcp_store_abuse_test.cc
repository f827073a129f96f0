// TcpStoreServer facing hostile or broken peers over raw sockets: lying lengths, garbage, half
// frames, silence, missing tokens, resets. Each test checks the server's answer, that it drops
// the connection, and that it still serves a well-behaved client afterwards.
#include <gtest/gtest.h>

#include <csignal>
#include <thread>

#include "comm/errors.h"
#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "tests/comm/store/alloc_probe.h"
#include "tests/comm/store/raw_client.h"

namespace weightcast::comm {
namespace {

using namespace std::chrono_literals;
namespace proto = store_protocol;
using testing::RawClient;

std::string u32le(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A frame whose body is `body` verbatim, so fields inside can lie about their lengths.
std::string frame(const std::string& body) {
  return u32le(static_cast<std::uint32_t>(body.size())) + body;
}

// Options of a client of `server` on loopback, with `token`.
TcpStoreOptions client_of(const TcpStoreServer& server, std::string token = "") {
  TcpStoreOptions o;
  o.port = server.port();
  o.token = std::move(token);
  return o;
}

void expect_still_serves(const TcpStoreServer& server) {
  TcpStoreOptions o = client_of(server);
  o.connect_timeout = 2s;
  TcpStore client(o);
  client.set("still", "serving", 1s);
  EXPECT_EQ(client.get("still", 1s), "serving");
}

TEST(TcpStoreAbuseTest, FrameClaimingOneGiBIsRefusedWithoutAllocatingIt) {
  TcpStoreServer server({});
  const std::size_t rss_before = testing::resident_bytes();
  testing::reset_largest_allocation();
  RawClient raw(server.port());
  // Only the header: a server that tried to read the body would wait instead of answering.
  ASSERT_TRUE(raw.send(u32le(1u << 30)));
  auto reply = raw.read_response(3s);
  ASSERT_TRUE(reply) << "no reply to a 1 GiB claim";
  EXPECT_EQ(reply->status, proto::Status::kTooLarge) << reply->message;
  EXPECT_TRUE(raw.closed_within(3s));
  EXPECT_LT(testing::largest_allocation(), std::size_t{1} << 20);
  EXPECT_LT(testing::resident_bytes(), rss_before + (std::size_t{64} << 20));
  EXPECT_EQ(server.stats().rejected_frames, 1u);
  expect_still_serves(server);
}

TEST(TcpStoreAbuseTest, InnerLengthsClaimingHugeSizesAreRefusedWithoutAllocating) {
  TcpStoreServer server({});
  const std::string set_head = std::string(1, static_cast<char>(proto::Op::kSet)) + u32le(1000);
  const std::string wait_head = std::string(1, static_cast<char>(proto::Op::kWait)) + u32le(1000);
  const std::vector<std::string> bodies = {
      set_head + u32le(1) + u32le(1) + "k" + u32le(1u << 30),  // value claims 1 GiB
      set_head + u32le(1) + u32le(1u << 30) + "k",             // key claims 1 GiB
      wait_head + u32le(0xffffffffu) + u32le(1) + "k",         // four billion keys
  };
  testing::reset_largest_allocation();
  for (const auto& body : bodies) {
    RawClient raw(server.port());
    ASSERT_TRUE(raw.send(frame(body)));
    auto reply = raw.read_response(3s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->status, proto::Status::kTooLarge) << reply->message;
    EXPECT_TRUE(raw.closed_within(3s));
  }
  EXPECT_LT(testing::largest_allocation(), std::size_t{1} << 20);
  EXPECT_EQ(server.stats().rejected_frames, bodies.size());
  expect_still_serves(server);
}

TEST(TcpStoreAbuseTest, GarbageBytesGetAnErrorAndTheConnectionIsDropped) {
  TcpStoreServer server({});
  {
    RawClient http(server.port());  // someone pointed an HTTP client at the store port
    ASSERT_TRUE(http.send("GET / HTTP/1.1\r\nHost: store\r\n\r\n"));
    auto reply = http.read_response(3s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->status, proto::Status::kTooLarge);
    EXPECT_TRUE(http.closed_within(3s));
  }
  {
    RawClient junk(server.port());
    ASSERT_TRUE(junk.send(frame(std::string("\x63\x01\x02\x03\x04\x05\x06", 7))));
    auto reply = junk.read_response(3s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->status, proto::Status::kBadRequest);
    EXPECT_TRUE(reply->message.find("unknown op") != std::string::npos) << reply->message;
    EXPECT_TRUE(junk.closed_within(3s));
  }
  {
    RawClient trailing(server.port());  // a valid CHECK followed by bytes it does not account for
    proto::Request check;
    check.op = proto::Op::kCheck;
    check.keys = {"k"};
    std::string f = proto::encode_request(check);
    ASSERT_TRUE(trailing.send(frame(f.substr(4) + "xyz")));
    auto reply = trailing.read_response(3s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->status, proto::Status::kBadRequest);
    EXPECT_TRUE(trailing.closed_within(3s));
  }
  EXPECT_EQ(server.stats().rejected_frames, 3u);
  expect_still_serves(server);
}

TEST(TcpStoreAbuseTest, HalfFramesThenSilenceAreDroppedAfterIoTimeout) {
  TcpStoreServerOptions sopts;
  sopts.io_timeout = 300ms;
  TcpStoreServer server(sopts);
  RawClient half_header(server.port());
  RawClient half_body(server.port());
  RawClient silent(server.port());  // connects and never says anything
  ASSERT_TRUE(half_header.send(std::string("\x10\x00", 2)));
  ASSERT_TRUE(half_body.send(u32le(100) + std::string(10, '\x03')));
  expect_still_serves(server);  // served while the stalled connections hang
  EXPECT_TRUE(half_header.closed_within(5s));
  EXPECT_TRUE(half_body.closed_within(5s));
  EXPECT_TRUE(silent.closed_within(5s));
  EXPECT_EQ(server.stats().dropped_stalled, 2u);
  // An idle but complete client is not a stalled frame: it keeps its connection.
  TcpStore idle(client_of(server));
  std::this_thread::sleep_for(600ms);
  idle.set("after-idle", "ok", 1s);
  EXPECT_EQ(idle.get("after-idle", 1s), "ok");
}

// `frame` sent on a fresh connection to `port` is answered with `status` and `message`, and the
// server closes the connection.
void expect_refused(std::uint16_t port, const std::string& frame, proto::Status status,
                    const std::string& message) {
  RawClient client(port);
  ASSERT_TRUE(client.send(frame));
  auto reply = client.read_response(3s);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, status);
  EXPECT_EQ(reply->message, message);
  EXPECT_TRUE(client.closed_within(3s));
}

TEST(TcpStoreAbuseTest, TokenServerRefusesRequestsBeforeHelloAndSilentPeers) {
  TcpStoreServerOptions sopts;
  sopts.token = "tok";
  sopts.io_timeout = 300ms;
  TcpStoreServer server(sopts);
  proto::Request set;  // skips the HELLO
  set.op = proto::Op::kSet;
  set.keys = {"k"};
  set.value = "v";
  expect_refused(server.port(), proto::encode_request(set), proto::Status::kUnauthorized,
                 "unauthorized (missing token)");
  expect_refused(server.port(), testing::hello_frame("tok-but-longer"), proto::Status::kForbidden,
                 "forbidden (wrong token)");
  {
    // Within the server's frame limit but far beyond any HELLO: refused before it is read.
    RawClient big(server.port());
    testing::reset_largest_allocation();
    ASSERT_TRUE(big.send(u32le(8u << 20) + std::string(1000, 'x')));
    auto reply = big.read_response(3s);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->status, proto::Status::kUnauthorized) << reply->message;
    EXPECT_TRUE(big.closed_within(3s));
    EXPECT_LT(testing::largest_allocation(), std::size_t{64} << 10);
  }
  {
    RawClient silent(server.port());  // never authenticates: must not hold a slot forever
    EXPECT_TRUE(silent.closed_within(5s));
  }
  TcpStore client(client_of(server, "tok"));
  EXPECT_FALSE(client.check("k", 1s));  // the unauthenticated SET changed nothing
}

TEST(TcpStoreAbuseTest, WritingToPeersThatLeftDoesNotRaiseSigpipe) {
  // Restore the default action so a SIGPIPE would end this test binary.
  std::signal(SIGPIPE, SIG_DFL);
  TcpStoreServer server({});
  TcpStore client(client_of(server));
  for (int round = 0; round < 3; ++round) {
    // A WAIT, then CHECKs, then the peer closes. The set wakes the WAIT; the server answers into
    // the closed socket (the peer resets it) and then writes the next CHECK reply into the reset
    // one: EPIPE, which would raise SIGPIPE without MSG_NOSIGNAL.
    const std::string go = "go" + std::to_string(round);
    proto::Request wait;
    wait.op = proto::Op::kWait;
    wait.timeout_ms = 5000;
    wait.keys = {go};
    proto::Request check;
    check.op = proto::Op::kCheck;
    check.keys = {go};
    RawClient raw(server.port());
    ASSERT_TRUE(raw.send(proto::encode_request(wait) + proto::encode_request(check) +
                         proto::encode_request(check)));
    raw.close();
    client.set(go, "now", 1s);
    std::this_thread::sleep_for(100ms);
  }
  expect_still_serves(server);
}

TEST(TcpStoreAbuseTest, ClientSeesPeerErrorWhenTheServerGoesAway) {
  std::signal(SIGPIPE, SIG_DFL);
  TcpStoreServer server({});
  TcpStore client(client_of(server));
  client.set("k", "v", 1s);
  server.stop();
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  try {
    // Large enough to take several send() calls: the later ones hit the reset connection.
    client.set("big", std::string(8 << 20, 'x'), 2s);
    FAIL() << "set on a stopped server returned";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), peer) << e.what();
  }
  try {
    client.get("k", 1s);
    FAIL() << "get on a stopped server returned";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer(), peer) << e.what();
  }
}

}  // namespace
}  // namespace weightcast::comm
