// Garbage on the wire against real processes: random bytes, half frames or requests, huge
// claimed lengths, endless header lines, silent and trickling (slowloris) connections, on the
// store port and on the engine's HTTP port. Each connection is dropped within the server's
// timeouts, the process neither crashes nor grows its memory, and it serves a well-behaved client
// afterwards (and while the slow ones hold connections open).
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "tests/security/engine_process.h"
#include "tests/security/net_probe.h"

namespace weightcast::security {
namespace {

using namespace std::chrono_literals;
namespace proto = comm::store_protocol;

std::string random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

std::string u32le(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// Sends one byte every `period` on each connection until stopped: each read the server makes
// succeeds well within its per-read timeout, so only a deadline on the whole request drops them.
class Trickler {
 public:
  Trickler(std::vector<RawConnection>& conns, std::chrono::milliseconds period)
      : thread_([&conns, period, this] {
          while (!stop_) {
            for (auto& c : conns) c.send("X");
            std::this_thread::sleep_for(period);
          }
        }) {}
  ~Trickler() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void expect_store_serves(const StoreProcess& store, const std::string& key) {
  comm::TcpStoreOptions o;
  o.host = store.host;
  o.port = static_cast<std::uint16_t>(store.port);
  o.connect_timeout = 5s;
  comm::TcpStore client(o);
  client.set(key, "v", 3s);
  EXPECT_EQ(client.get(key, 3s), "v");
}

TEST(SecurityGarbage, StorePortDropsGarbageHalfFramesHugeClaimsAndSlowPeers) {
  StoreProcess store({"--io-timeout-ms", "1000"});
  expect_store_serves(store, "warm");
  const std::size_t rss_before = resident_bytes(store.process.pid());
  std::mt19937_64 rng(7);

  // 32 connections of 64 KiB random bytes each; half of them end with a reset.
  std::vector<RawConnection> garbage;
  for (int i = 0; i < 32; ++i) {
    garbage.emplace_back(store.host, store.port);
    ASSERT_TRUE(garbage.back().connected());
    garbage.back().send(random_bytes(rng, 64 << 10));
  }
  for (std::size_t i = 0; i < garbage.size(); ++i) {
    if (i % 2) {
      garbage[i].reset();
    } else {
      EXPECT_TRUE(garbage[i].closed_within(5s)) << "garbage connection " << i << " kept open";
    }
  }

  // A header claiming 4 GiB, and a well-formed frame whose key count claims 2^31 keys.
  RawConnection huge(store.host, store.port);
  ASSERT_TRUE(huge.send(u32le(0xFFFFFFFFu)));
  const std::string reply = huge.read(5, 3s);
  ASSERT_EQ(reply.size(), 5u) << "no answer to a 4 GiB claim";
  EXPECT_EQ(static_cast<proto::Status>(reply[4]), proto::Status::kTooLarge);
  EXPECT_TRUE(huge.closed_within(3s));
  RawConnection keys(store.host, store.port);
  const std::string body = std::string(1, '\x02') + u32le(0) + u32le(0x80000000u);
  ASSERT_TRUE(keys.send(u32le(static_cast<std::uint32_t>(body.size())) + body));
  EXPECT_TRUE(keys.closed_within(3s));

  // Half frames, then silence; silent connections that never send a byte; and connections that
  // trickle a frame one byte at a time. All are dropped after --io-timeout-ms.
  std::vector<RawConnection> slow;
  for (int i = 0; i < 16; ++i) {
    slow.emplace_back(store.host, store.port);
    if (i % 2 == 0) slow.back().send(u32le(100) + "0123456789");
  }
  std::vector<RawConnection> trickle;
  for (int i = 0; i < 8; ++i) {
    trickle.emplace_back(store.host, store.port);
    trickle.back().send(u32le(200));
  }
  {
    Trickler t(trickle, 200ms);
    expect_store_serves(store, "during");  // while all of them hold connections
    for (auto& c : slow) EXPECT_TRUE(c.closed_within(6s));
    for (auto& c : trickle) EXPECT_TRUE(c.closed_within(6s));
  }

  const std::size_t rss_after = resident_bytes(store.process.pid());
  std::printf("[figure] store RSS before %zu KiB, after garbage %zu KiB\n", rss_before >> 10,
              rss_after >> 10);
  EXPECT_LT(rss_after, rss_before + (std::size_t{32} << 20));
  EXPECT_TRUE(store.process.running());
  expect_store_serves(store, "after");
}

TEST(SecurityGarbage, HttpPortDropsGarbageEndlessHeadersAndSlowPeers) {
  // Few handler threads and a short timeout, so slow peers would visibly starve the server.
  EngineProcess engine({"--http-timeout-ms", "1000", "--http-threads", "4", "--max-buckets-ahead",
                        "2", "--max-body-bytes", "1M"});
  const EngineState before = engine.state();
  const std::size_t rss_before = resident_bytes(engine.pid());
  std::mt19937_64 rng(11);

  // Twice as many as handler threads: each is dropped within --http-timeout-ms of its turn.
  std::vector<RawConnection> garbage;
  for (int i = 0; i < 8; ++i) {
    garbage.emplace_back(engine.host(), engine.port());
    ASSERT_TRUE(garbage.back().connected());
    garbage.back().send(random_bytes(rng, 16 << 10));
  }
  for (auto& c : garbage) EXPECT_TRUE(c.closed_within(8s));

  // 32 MiB of header lines, and 32 MiB of one header line that never ends: the server must stop
  // reading long before (a few KiB of head is plenty for this API).
  auto flood = [&](const std::string& start, const std::string& chunk) {
    RawConnection c(engine.host(), engine.port());
    EXPECT_TRUE(c.connected());
    std::size_t sent = 0;
    if (c.send(start)) {
      while (sent < (std::size_t{32} << 20) && c.send(chunk)) sent += chunk.size();
    }
    EXPECT_TRUE(c.closed_within(5s));
    return sent;
  };
  const std::size_t lines =
      flood("GET /health HTTP/1.1\r\nHost: x\r\n", "X-Fill: " + std::string(8000, 'a') + "\r\n");
  const std::size_t line = flood("GET /health HTTP/1.1\r\nX-Fill: ", std::string(64 << 10, 'a'));
  std::printf("[figure] header flood: server stopped reading after %zu / %zu bytes\n", lines, line);

  // A half request, then silence; connections that never send; and slowloris connections that
  // trickle a request head one byte at a time, each well within the per-read timeout.
  std::vector<RawConnection> slow;
  for (int i = 0; i < 6; ++i) {
    slow.emplace_back(engine.host(), engine.port());
    if (i % 2 == 0) {
      slow.back().send(
          "POST /begin_weight_update HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"selector\"");
    }
  }
  std::vector<RawConnection> trickle;
  for (int i = 0; i < 6; ++i) {
    trickle.emplace_back(engine.host(), engine.port());
    trickle.back().send("GET /health HTTP/1.1\r\nX-Slow: ");
  }
  {
    Trickler t(trickle, 200ms);
    // More slow peers than handler threads: a request still gets through within a few timeouts.
    const HttpReply health = engine.get("/health");
    EXPECT_EQ(health.status, 200) << health.body;
    for (auto& c : slow) EXPECT_TRUE(c.closed_within(8s));
    for (auto& c : trickle) EXPECT_TRUE(c.closed_within(8s));
  }

  const std::size_t rss_after = resident_bytes(engine.pid());
  std::printf("[figure] engine RSS before %zu KiB, after HTTP garbage %zu KiB\n", rss_before >> 10,
              rss_after >> 10);
  EXPECT_LT(rss_after, rss_before + (std::size_t{32} << 20));
  EXPECT_TRUE(engine.process().running());
  EXPECT_EQ(engine.state(), before);
}

}  // namespace
}  // namespace weightcast::security
