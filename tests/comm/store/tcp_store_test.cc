// TcpStore/TcpStoreServer behaviour beyond the shared Store suite: tokens, limits enforced by the
// server, connect/reconnect, stop(), port reuse, address families, and real processes meeting
// through one server.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <set>
#include <thread>

#include "comm/errors.h"
#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "comm/transport/socket_io.h"
#include "tests/support/subprocess.h"
#include "tests/support/time_bounds.h"

namespace weightcast::comm {
namespace {

using namespace std::chrono_literals;
namespace proto = store_protocol;

TcpStoreOptions client_for(const TcpStoreServer& server, std::string token = {}) {
  TcpStoreOptions o;
  o.host = server.host();
  o.port = server.port();
  o.token = std::move(token);
  o.connect_timeout = 5s;
  return o;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Connecting with `o` must fail with E: its message ("" and a failure naming `accepted` when the
// connection was made instead).
template <typename E>
std::string connect_error(const TcpStoreOptions& o, const std::string& accepted) {
  try {
    TcpStore c(o);
    ADD_FAILURE() << accepted;
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// A socket bound to an ephemeral loopback port that does not listen: connecting is refused, and
// nobody else can take the port while it is held. SO_REUSEADDR lets a server bind it later.
struct HeldPort {
  HeldPort() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~HeldPort() { release(); }
  void release() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  int fd = -1;
  std::uint16_t port = 0;
};

TEST(TcpStoreTest, TokenAcceptedOnlyWhenCorrectWithDistinctRefusals) {
  TcpStoreServerOptions sopts;
  sopts.token = "s3cret-token";
  TcpStoreServer server(sopts);

  TcpStore good(client_for(server, "s3cret-token"));
  good.set("k", "v", 1s);
  EXPECT_EQ(good.get("k", 1s), "v");

  const std::string missing =
      connect_error<ConfigError>(client_for(server), "missing token accepted");
  const std::string wrong = connect_error<ConfigError>(client_for(server, "not-the-token-at-all"),
                                                       "wrong token accepted");
  const std::string wrong_same_length = connect_error<ConfigError>(
      client_for(server, "s3cret-tokeN"), "wrong token of the same length accepted");
  EXPECT_TRUE(contains(missing, "missing token")) << missing;
  EXPECT_TRUE(contains(wrong, "wrong token")) << wrong;
  EXPECT_TRUE(contains(wrong_same_length, "wrong token")) << wrong_same_length;
  EXPECT_TRUE(contains(missing, server.host() + ":" + std::to_string(server.port()))) << missing;
  EXPECT_EQ(server.stats().auth_failures, 3u);
  EXPECT_EQ(good.get("k", 1s), "v");  // refusals did not disturb the authenticated client
}

TEST(TcpStoreTest, ServerRefusesOversizedValueFromALaxClient) {
  TcpStoreServerOptions sopts;
  sopts.max_value_bytes = 1024;
  TcpStoreServer server(sopts);
  auto copts = client_for(server);
  copts.max_value_bytes = 1 << 20;  // the client would allow it; the server must not
  TcpStore client(copts);
  try {
    client.set("big", std::string(4096, 'x'), 2s);
    FAIL() << "server accepted a value over its limit";
  } catch (const BadRequestError& e) {
    EXPECT_TRUE(contains(e.what(), "too large")) << e.what();
  }
  EXPECT_EQ(server.stats().rejected_frames, 1u);
  // The server dropped that connection; the client reconnects on its next call.
  client.set("small", "ok", 2s);
  EXPECT_EQ(client.get("small", 1s), "ok");
  EXPECT_FALSE(client.check("big", 1s));
}

TEST(TcpStoreTest, PortIsReleasedAfterStop) {
  std::uint16_t port = 0;
  {
    TcpStoreServer server({});
    port = server.port();
    ASSERT_NE(port, 0);
    TcpStore client(client_for(server));
    client.set("k", "v", 1s);
    server.stop();
    server.stop();  // idempotent
  }
  TcpStoreServerOptions again;
  again.port = port;
  TcpStoreServer second(again);  // throws ConfigError if the port were still held
  EXPECT_EQ(second.port(), port);
  TcpStore client(client_for(second));
  EXPECT_FALSE(client.check("k", 1s));  // a fresh server, not the old one
}

TEST(TcpStoreTest, StopWakesABlockedClientWithPeerError) {
  TcpStoreServer server({});
  TcpStore client(client_for(server));
  auto blocked = std::async(std::launch::async, [&]() -> std::string {
    try {
      client.get("never", 30s);
    } catch (const PeerError& e) {
      return e.peer();
    } catch (const std::exception& e) {
      return std::string("wrong error: ") + e.what();
    }
    return "returned";
  });
  std::this_thread::sleep_for(200ms);
  const auto start = std::chrono::steady_clock::now();
  server.stop();
  ASSERT_EQ(blocked.wait_for(10s), std::future_status::ready) << "client still blocked";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(blocked.get(), "127.0.0.1:" + std::to_string(server.port()));
  // With the server gone, later calls fail the same way instead of hanging.
  EXPECT_THROW(client.set("k", "v", 1s), PeerError);
}

TEST(TcpStoreTest, ConnectToAPortNobodyListensOnTimesOutInBounds) {
  HeldPort held;
  TcpStoreOptions o;
  o.port = held.port;
  o.connect_timeout = 500ms;
  const auto start = std::chrono::steady_clock::now();
  const std::string what = connect_error<TimeoutError>(o, "connected to a port nobody listens on");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 250ms);
  EXPECT_LE(elapsed, weightcast::testing::late_bound(o.connect_timeout));
  EXPECT_TRUE(contains(what, "127.0.0.1:" + std::to_string(held.port))) << what;
}

TEST(TcpStoreTest, ClientRetriesUntilTheServerStarts) {
  HeldPort held;
  auto o = TcpStoreOptions{};
  o.port = held.port;
  o.connect_timeout = 10s;
  auto client = std::async(std::launch::async, [o] {
    TcpStore c(o);
    return c.get("ready", 5s);
  });
  std::this_thread::sleep_for(300ms);
  TcpStoreServerOptions sopts;
  sopts.port = held.port;
  TcpStoreServer server(sopts);
  held.release();
  TcpStore setter(client_for(server));
  setter.set("ready", "yes", 1s);
  ASSERT_EQ(client.wait_for(15s), std::future_status::ready);
  EXPECT_EQ(client.get(), "yes");
}

TEST(TcpStoreTest, ConnectionsOverTheLimitAreRefused) {
  TcpStoreServerOptions sopts;
  sopts.max_connections = 2;
  TcpStoreServer server(sopts);
  auto a = std::make_unique<TcpStore>(client_for(server));
  TcpStore b(client_for(server));
  auto o = client_for(server);
  o.connect_timeout = 400ms;
  const std::string what = connect_error<TimeoutError>(o, "a third connection was served");
  EXPECT_TRUE(contains(what, "limit")) << what;
  EXPECT_GE(server.stats().refused, 1u);
  a.reset();  // frees a slot; a new client gets it
  o.connect_timeout = 5s;
  TcpStore c(o);
  c.set("k", "v", 1s);
  EXPECT_EQ(b.get("k", 1s), "v");
}

TEST(TcpStoreTest, BindsIpv6LiteralAndHostname) {
  for (const char* host : {"::1", "localhost"}) {
    TcpStoreServerOptions sopts;
    sopts.bind_address = host;
    std::unique_ptr<TcpStoreServer> server;
    try {
      server = std::make_unique<TcpStoreServer>(sopts);
    } catch (const ConfigError& e) {
      if (std::string(host) == "::1") continue;  // no IPv6 loopback on this machine
      throw;
    }
    EXPECT_EQ(server->host(), host);
    TcpStore client(client_for(*server));
    client.set("family", host, 1s);
    EXPECT_EQ(client.get("family", 1s), host);
  }
}

TEST(TcpStoreTest, UnusableBindAddressOrBusyPortIsConfigError) {
  TcpStoreServerOptions bad;
  bad.bind_address = "no-such-host.invalid";
  EXPECT_THROW(TcpStoreServer{bad}, ConfigError);
  TcpStoreServer first({});
  TcpStoreServerOptions same;
  same.port = first.port();
  EXPECT_THROW(TcpStoreServer{same}, ConfigError);
}

// A hand-made server that answers the first CHECK late and every later one promptly with the
// opposite answer: a client that reused a timed-out connection would read the stale reply.
TEST(TcpStoreTest, TimeoutMidCallReconnectsInsteadOfReadingAStaleReply) {
  std::uint16_t port = 0;
  std::string error;
  net::Fd listener = net::listen_on("127.0.0.1", 0, &port, &error);
  ASSERT_TRUE(listener) << error;
  std::atomic<int> connections{0};
  std::atomic<bool> stop{false};
  std::thread fake([&] {
    std::vector<net::Fd> open;
    while (!stop) {
      if (!net::wait_readable(listener.get(), deadline_after(5s), &stop).ok()) break;
      int err = 0;
      net::Fd conn = net::accept_one(listener.get(), &err);
      if (!conn) continue;
      const int n = ++connections;
      for (int i = 0; i < 2; ++i) {  // HELLO, then one CHECK
        char header[4];
        const auto deadline = deadline_after(5s);
        if (!net::recv_exact(conn.get(), header, 4, deadline, &stop).ok()) break;
        std::string body;
        net::recv_append(conn.get(), &body, proto::decode_frame_length({header, 4}), deadline,
                         &stop);
        proto::Response r;
        if (i == 1) {
          if (n == 1) std::this_thread::sleep_for(600ms);
          r.value = std::string(1, n == 1 ? '\1' : '\0');
        }
        net::send_all(conn.get(), proto::encode_response(r), deadline_after(5s), &stop);
      }
      open.push_back(std::move(conn));
    }
  });
  {
    TcpStoreOptions o;
    o.port = port;
    TcpStore client(o);
    EXPECT_THROW(client.check("k", 200ms), TimeoutError);
    std::this_thread::sleep_for(600ms);  // the late reply is now sitting in the old socket
    EXPECT_FALSE(client.check("k", 2s));
    EXPECT_EQ(connections.load(), 2);
  }
  stop = true;
  fake.join();
}

TEST(TcpStoreTest, SomethingElseOnThePortIsAPeerErrorNotAHang) {
  std::uint16_t port = 0;
  std::string error;
  net::Fd listener = net::listen_on("127.0.0.1", 0, &port, &error);
  ASSERT_TRUE(listener) << error;
  std::thread http([&] {
    if (!net::wait_readable(listener.get(), deadline_after(5s)).ok()) return;
    int err = 0;
    net::Fd conn = net::accept_one(listener.get(), &err);
    if (!conn) return;
    net::send_all(conn.get(), "HTTP/1.1 400 Bad Request\r\n\r\n", deadline_after(5s));
    net::shutdown_and_drain(conn.get(), 2s);
  });
  TcpStoreOptions o;
  o.port = port;
  o.connect_timeout = 5s;
  const std::string what = connect_error<PeerError>(o, "an HTTP server was taken for a store");
  EXPECT_TRUE(contains(what, "not a weightcast store server")) << what;
  http.join();
}

TEST(TcpStoreTest, ThreeProcessesMeetThroughOneServer) {
  TcpStoreServerOptions sopts;
  sopts.token = "multi-process-token";
  TcpStoreServer server(sopts);
  constexpr int kWorld = 3;
  std::vector<testing::Subprocess> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back(
        std::vector<std::string>{WEIGHTCAST_STORE_TOOL, "127.0.0.1", std::to_string(server.port()),
                                 std::to_string(r), std::to_string(kWorld), "10000"},
        std::vector<std::string>{"WEIGHTCAST_STORE_TOKEN=multi-process-token"});
  }
  std::set<std::string> orders;
  for (int r = 0; r < kWorld; ++r) {
    auto order = ranks[r].wait_for_line("arrived rank=" + std::to_string(r) + " order=", 15s);
    ASSERT_TRUE(order) << "rank " << r << " output: " << ranks[r].output();
    orders.insert(*order);
    ASSERT_TRUE(ranks[r].wait_for_line("done rank=" + std::to_string(r), 15s))
        << "rank " << r << " output: " << ranks[r].output();
    EXPECT_EQ(ranks[r].wait(10s), 0) << "rank " << r;
  }
  EXPECT_EQ(orders, (std::set<std::string>{"1", "2", "3"}));
  TcpStore observer(client_for(server, "multi-process-token"));
  EXPECT_EQ(observer.get("arrived", 1s), "3");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(observer.get("rank/" + std::to_string(r), 1s), "payload-from-" + std::to_string(r));
  }
}

}  // namespace
}  // namespace weightcast::comm
