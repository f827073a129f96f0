// Authentication against real processes. The engine test walks the engine's own route table
// (engine_routes), so a route added later is covered without editing this file: every route, with
// both GET and POST, without a token (401), with another scheme (401), with wrong tokens (403)
// and with the right one; refused calls carry bodies that would change state and must change
// nothing. Only /health and /metrics may be public, and every route that takes POST needs the
// token. The store test checks its HELLO handshake from a raw socket and through the client.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "comm/errors.h"
#include "comm/store/store_protocol.h"
#include "comm/store/tcp_store.h"
#include "sync/engine/http/routes.h"
#include "tests/security/engine_process.h"
#include "tests/security/inprocess_engine.h"
#include "tests/security/net_probe.h"

namespace weightcast::security {
namespace {

using namespace std::chrono_literals;
using sync::engine::Auth;
using sync::engine::Method;
namespace proto = comm::store_protocol;

const std::string kToken = "s3cret-t0ken";

// A body that would change the engine's state if the route ran it.
std::string mutating_body(const std::string& path, int store_port) {
  if (path == "/init_weights_update_group") {
    return R"({"master_address":"127.0.0.1","master_port":)" + std::to_string(store_port) +
           R"(,"rank_offset":1,"world_size":2,"group_name":"g","backend":"gloo"})";
  }
  if (path == "/pause_generation") return R"({"mode":"in_place"})";
  if (path == "/begin_weight_update") return R"({"selector":"all"})";
  if (path == "/update_weight_version") return R"({"new_version":"evil"})";
  if (path == "/destroy_weights_update_group") return R"({"group_name":"g"})";
  return "{}";
}

TEST(SecurityAuth, EveryRouteOfTheTableRefusesMissingAndWrongTokensOnARealEngine) {
  const auto inprocess = make_inprocess_engine();
  const sync::engine::RouteTable table = sync::engine::engine_routes(*inprocess);
  ASSERT_FALSE(table.routes().empty());

  EngineProcess engine({}, kToken);
  Listener fake_store("127.0.0.1");  // a refused init must never dial it
  const EngineState before = engine.state();
  const std::vector<std::string> missing = {"", "Basic dXNlcjpwYXNz", "Token " + kToken};
  const std::vector<std::string> wrong = {"Bearer wrong", "Bearer " + kToken + "x",
                                          "Bearer " + kToken.substr(0, kToken.size() - 1),
                                          "Bearer " + std::string(4096, 'A')};
  std::set<std::string> public_paths;
  int checked = 0;
  for (const auto& route : table.routes()) {
    if (route.auth == Auth::kPublic) public_paths.insert(route.path);
    const bool takes_post = std::count(route.methods.begin(), route.methods.end(), Method::kPost);
    EXPECT_TRUE(!takes_post || route.auth == Auth::kToken)
        << route.path << " takes POST but needs no token";
    const std::string path =
        route.path == "/weights_checksum" ? route.path + "?runner=target" : route.path;
    for (Method m : {Method::kGet, Method::kPost}) {
      const std::string method(sync::engine::to_string(m));
      SCOPED_TRACE(method + " " + path);
      const bool allowed = std::count(route.methods.begin(), route.methods.end(), m) > 0;
      const std::string body =
          m == Method::kPost ? mutating_body(route.path, fake_store.port()) : "";
      for (const auto& auth : missing) {
        const HttpReply r = engine.call(method, path, body, auth);
        ++checked;
        if (!allowed) {
          EXPECT_EQ(r.status, 405) << r.body;
        } else if (route.auth == Auth::kToken) {
          EXPECT_EQ(r.status, 401) << auth << ": " << r.body;
          EXPECT_EQ(r.headers.count("WWW-Authenticate") ? r.headers.at("WWW-Authenticate") : "",
                    "Bearer");
          EXPECT_EQ(r.json.value("success", true), false);
        } else {
          EXPECT_EQ(r.status, 200) << r.body.substr(0, 200);
        }
      }
      for (const auto& auth : wrong) {
        const HttpReply r = engine.call(method, path, body, auth);
        ++checked;
        const int want = !allowed ? 405 : route.auth == Auth::kToken ? 403 : 200;
        EXPECT_EQ(r.status, want) << auth.substr(0, 40) << ": " << r.body.substr(0, 200);
      }
    }
  }
  EXPECT_EQ(engine.state(), before) << "a refused call changed the engine";
  EXPECT_FALSE(fake_store.accepted_within(200ms)) << "a refused init dialled its master";
  EXPECT_EQ(public_paths, (std::set<std::string>{"/health", "/metrics"}));

  // With the right token every route is reachable on the real process (its table is the same),
  // and none answers 401/403.
  for (const auto& route : table.routes()) {
    const std::string path =
        route.path == "/weights_checksum" ? route.path + "?runner=target" : route.path;
    for (Method m : route.methods) {
      const HttpReply r = engine.call(std::string(sync::engine::to_string(m)), path,
                                      m == Method::kPost ? "{}" : "", "bEaReR " + kToken);
      EXPECT_TRUE(r.status != 401 && r.status != 403 && r.status != 404 && r.status != 405 &&
                  r.status != 0)
          << route.path << ": " << r.status << " " << r.body.substr(0, 200);
    }
  }
  std::printf("[figure] engine auth: %zu routes, %d refused calls checked\n", table.routes().size(),
              checked);
}

comm::TcpStoreOptions client_options(const StoreProcess& store, const std::string& token) {
  comm::TcpStoreOptions o;
  o.host = store.host;
  o.port = static_cast<std::uint16_t>(store.port);
  o.token = token;
  o.connect_timeout = 3s;
  return o;
}

proto::Status first_status(RawConnection& c) {
  const std::string head = c.read(5, 3s);
  return head.size() == 5 ? static_cast<proto::Status>(head[4]) : proto::Status::kOk;
}

std::string hello(const std::string& token) {
  proto::Request r;
  r.op = proto::Op::kHello;
  r.keys = {std::string(proto::kProtocolName)};
  r.value = token;
  return proto::encode_request(r);
}

TEST(SecurityAuth, StoreRefusesMissingAndWrongTokensOnARealServer) {
  StoreProcess store({"--token", kToken});
  comm::TcpStore owner(client_options(store, kToken));
  owner.set("secret", "weights-are-coming", 2s);

  proto::Request get;
  get.op = proto::Op::kGet;
  get.keys = {"secret"};
  RawConnection skip_hello(store.host, store.port);
  ASSERT_TRUE(skip_hello.send(proto::encode_request(get)));
  EXPECT_EQ(first_status(skip_hello), proto::Status::kUnauthorized);
  EXPECT_TRUE(skip_hello.closed_within(3s));

  for (const std::string& token : {std::string(), std::string("wrong")}) {
    RawConnection c(store.host, store.port);
    ASSERT_TRUE(c.send(hello(token) + proto::encode_request(get)));
    EXPECT_EQ(first_status(c),
              token.empty() ? proto::Status::kUnauthorized : proto::Status::kForbidden);
    EXPECT_TRUE(c.closed_within(3s)) << "the GET after a refused HELLO must not be answered";
  }
  for (const std::string& token : {std::string(), std::string("wrong"), kToken + "x"}) {
    EXPECT_THROW(comm::TcpStore client(client_options(store, token)), comm::ConfigError)
        << "'" << token << "'";
  }
  comm::TcpStore good(client_options(store, kToken));
  EXPECT_EQ(good.get("secret", 2s), "weights-are-coming");
}

}  // namespace
}  // namespace weightcast::security
