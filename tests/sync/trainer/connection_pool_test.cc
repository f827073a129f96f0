// Keep-alive connections to an engine (sync/trainer/http/connection_pool.h): requests within an
// update share a connection, requests in flight at once each get their own, and a connection is
// reused only after a complete answer; the server's connection ids are the client's ports.
#include "sync/trainer/http/connection_pool.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/errors.h"
#include "sync/trainer/http/engine_client.h"
#include "tests/sync/trainer/http_test_server.h"

namespace weightcast::sync::trainer {
namespace {

using testing::HttpTestServer;

// Client options whose kept connections wait long enough for a loaded machine's pauses between
// two calls: the counts below are then the reuse rule's, not the scheduler's.
EngineClientOptions fast_client_options() {
  auto o = testing::fast_client_options();
  o.keep_alive_idle = std::chrono::seconds(30);
  return o;
}

// A /health route that records each request's connection (the client's port) and answers
// `message(n)` to the n-th request (0-based).
class CountingServer {
 public:
  explicit CountingServer(std::function<std::string(int)> message = nullptr)
      : message_(std::move(message)) {
    s_.http().set_keep_alive_max_count(100);  // httplib's default closes after 5 requests
    s_.http().Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      int n = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ports_.insert(req.remote_port);
        n = requests_++;
      }
      res.set_content(to_json_string(BasicResponse{true, message_ ? message_(n) : ""}),
                      "application/json");
    });
  }
  httplib::Server& http() { return s_.http(); }
  std::string url() const { return s_.url(); }
  std::size_t connections() {
    std::lock_guard<std::mutex> lock(mu_);
    return ports_.size();
  }

 private:
  HttpTestServer s_;
  std::function<std::string(int)> message_;
  std::mutex mu_;
  std::set<int> ports_;
  int requests_ = 0;
};

TEST(ConnectionPool, RequestsInARowShareOneConnection) {
  CountingServer s;
  EngineClient client(s.url(), fast_client_options());
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(client.health().success);
  EXPECT_EQ(s.connections(), 1U);
}

TEST(ConnectionPool, WithoutKeepAliveEveryRequestConnects) {
  CountingServer s;
  auto options = fast_client_options();
  options.keep_alive = false;
  EngineClient client(s.url(), options);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(client.health().success);
  EXPECT_EQ(s.connections(), 5U);
}

TEST(ConnectionPool, RequestsInFlightAtOnceEachGetTheirOwn) {
  // Every request waits in the handler until all four arrived: shared connections would deadlock
  // (bounded by the client's read timeout) instead of meeting.
  HttpTestServer s;
  std::mutex mu;
  std::condition_variable cv;
  std::set<int> ports;
  int arrived = 0;
  s.http().Get("/health", [&](const httplib::Request& req, httplib::Response& res) {
    std::unique_lock<std::mutex> lock(mu);
    ports.insert(req.remote_port);
    ++arrived;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return arrived >= 4; });
    res.set_content(to_json_string(BasicResponse{true, ""}), "application/json");
  });
  s.http().set_keep_alive_max_count(100);
  EngineClient client(s.url(), fast_client_options());
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      try {
        if (client.health().success) ++ok;
      } catch (const std::exception&) {
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(ports.size(), 4U);
  // The four connections are kept (kMaxIdle); the next requests in a row take one of them.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(client.health().success);
  EXPECT_EQ(ports.size(), 4U);
}

TEST(ConnectionPool, AConnectionWhoseAnswerTimedOutIsNeverReused) {
  // The first answer comes after the client gave up; were its connection reused, the second
  // request would read that late answer ("first") as its own. (cpp-httplib closes a connection
  // whose request failed, and the pool keeps only connections that got a whole answer.)
  HttpTestServer s;
  std::atomic<int> n{0};
  s.http().Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    const int i = n++;
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    res.set_content(to_json_string(BasicResponse{true, i == 0 ? "first" : "second"}),
                    "application/json");
  });
  auto options = fast_client_options();
  options.request_timeout = comm::Millis(1000);
  EngineClient client(s.url(), options);
  EXPECT_THROW(client.health(), comm::TimeoutError);
  // On the first connection the server would write the late answer before reading this request.
  EXPECT_EQ(client.health().message, "second");
}

TEST(ConnectionPool, AnAnswerTooLargeLeavesItsConnectionBehind) {
  HttpTestServer s;
  std::atomic<int> n{0};
  std::set<int> ports;
  std::mutex mu;
  s.http().Get("/health", [&](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ports.insert(req.remote_port);
    }
    const std::string message = n++ == 0 ? std::string(1 << 20, 'x') : "small";
    res.set_content(to_json_string(BasicResponse{true, message}), "application/json");
  });
  auto options = fast_client_options();
  options.limits.max_body_bytes = 64 << 10;
  EngineClient client(s.url(), options);
  EXPECT_THROW(client.health(), EngineError);
  EXPECT_EQ(client.health().message, "small");
  EXPECT_EQ(ports.size(), 2U);
}

TEST(ConnectionPool, AServerThatClosesAfterEachFewRequestsIsFollowed) {
  // "Connection: close" on every second answer: the client reconnects, no request fails.
  CountingServer s([](int n) { return std::to_string(n); });
  s.http().set_keep_alive_max_count(2);
  EngineClient client(s.url(), fast_client_options());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(client.health().message, std::to_string(i));
  EXPECT_EQ(s.connections(), 3U);
}

TEST(ConnectionPool, AConnectionTheServerClosedWhileIdleIsReplaced) {
  CountingServer s;
  s.http().set_keep_alive_timeout(1);  // seconds: the server closes idle connections after it
  ConnectionPool pool(s.url(), std::chrono::milliseconds(60000));
  for (int i = 0; i < 2; ++i) {
    auto lease = pool.acquire();
    auto result = lease.client().Get("/health");
    ASSERT_TRUE(result) << httplib::to_string(result.error());
    EXPECT_EQ(result->status, 200);
    lease.keep();
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  }
  EXPECT_EQ(pool.reuses(), 1U);
  EXPECT_EQ(s.connections(), 2U);
}

TEST(ConnectionPool, IdleConnectionsExpireAndAreCapped) {
  CountingServer s;
  ConnectionPool pool(s.url(), std::chrono::milliseconds(100));
  {
    std::vector<ConnectionPool::Lease> leases;
    // kMaxIdle + 2 connections at once, fewer than the test server's 8 handler threads.
    for (std::size_t i = 0; i < ConnectionPool::kMaxIdle + 2; ++i) leases.push_back(pool.acquire());
    for (auto& lease : leases) {
      ASSERT_TRUE(lease.client().Get("/health"));
      lease.keep();
    }
  }
  EXPECT_EQ(pool.idle(), ConnectionPool::kMaxIdle);
  EXPECT_EQ(pool.reuses(), 0U);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  {
    auto lease = pool.acquire();
    EXPECT_FALSE(lease.reused());
  }  // not kept: no answer
  EXPECT_EQ(pool.idle(), 0U);
  EXPECT_EQ(pool.reuses(), 0U);
}

}  // namespace
}  // namespace weightcast::sync::trainer
