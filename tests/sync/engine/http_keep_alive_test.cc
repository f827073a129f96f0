// Keep-alive connections to the engine's HTTP server: a request refused before its body was read
// (404, 405, 401, 403) ends its connection, so the unread body is never taken for the next
// request and every answer on a kept connection is its own request's.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

class KeepAliveTest : public EngineHttpFixture {
 protected:
  // Writes `bytes` on a new connection and reads until the server closes it (bounded: 10 s).
  std::string exchange(const std::string& bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(server_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string out;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size())) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      char buf[4096];
      while (std::chrono::steady_clock::now() < deadline) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 200) <= 0) continue;
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        out.append(buf, static_cast<std::size_t>(n));
      }
    }
    ::close(fd);
    return out;
  }

  static int answers(const std::string& text) {
    int n = 0;
    for (std::size_t at = text.find("HTTP/1.1 "); at != std::string::npos;
         at = text.find("HTTP/1.1 ", at + 1)) {
      ++n;
    }
    return n;
  }
};

// A body that is itself a request: were it read as the next request, a second answer would come.
const std::string kSmuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

std::string raw_post(const std::string& route, const std::string& auth, const std::string& body) {
  return "POST " + route + " HTTP/1.1\r\nHost: x\r\n" + auth +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

TEST_F(KeepAliveTest, ARefusedBodyIsNeverReadAsTheNextRequest) {
  start({}, "s3cret");
  const std::string next = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const struct {
    std::string request;
    int status;
  } cases[] = {
      {raw_post("/pause_generation", "Authorization: Bearer wrong\r\n", kSmuggled), 403},
      {raw_post("/pause_generation", "", kSmuggled), 401},
      {raw_post("/no_such_route", "", kSmuggled), 404},
      {raw_post("/health", "", kSmuggled), 405},
  };
  for (const auto& c : cases) {
    const std::string got = exchange(c.request + next);
    EXPECT_EQ(got.rfind("HTTP/1.1 " + std::to_string(c.status), 0), 0U) << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
    EXPECT_EQ(answers(got), 1) << "the unread body or the request after it was answered:\n" << got;
  }
  auto [status, body] = get("/health");  // and the engine still answers
  EXPECT_EQ(status, 200) << body.dump();
}

TEST_F(KeepAliveTest, AKeptClientGetsItsOwnAnswerAfterARefusal) {
  start({}, "s3cret");
  httplib::Client client(server_->host(), server_->port());
  client.set_keep_alive(true);
  client.set_read_timeout(10, 0);
  for (int i = 0; i < 50; ++i) {
    httplib::Headers wrong = {{"Authorization", "Bearer wrong"}};
    auto refused =
        client.Post("/pause_generation", wrong, R"({"mode":"abort"})", "application/json");
    ASSERT_TRUE(refused) << httplib::to_string(refused.error());
    EXPECT_EQ(refused->status, 403);
    auto missing = client.Post("/no_such_route", R"({"a":1})", "application/json");
    ASSERT_TRUE(missing) << httplib::to_string(missing.error());
    EXPECT_EQ(missing->status, 404);
    auto health = client.Get("/health");
    ASSERT_TRUE(health) << httplib::to_string(health.error());
    EXPECT_EQ(health->status, 200) << health->body;
  }
}

TEST_F(KeepAliveTest, AnswersWithoutABodyKeepTheConnection) {
  start({}, "s3cret");
  // Two requests in one write: both answered on the one connection, which stays open.
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string got =
      exchange(get + "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(answers(got), 2) << got;
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
