// EngineClient against an in-process HTTP server: routes and bodies from the shared schemas,
// the bearer token, and errors that name the engine and the route (engine message included),
// timeouts as TimeoutError, a closed port as an unreachable engine.
#include "sync/trainer/engine_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/errors.h"

namespace weightcast::sync::trainer {
namespace {

class Server {
 public:
  Server() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op until the accept loop runs, so wait for it (bounded).
    for (int i = 0; i < 500 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Server() { stop(); }
  void stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  httplib::Server& http() { return server_; }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

EngineClientOptions fast(std::string token = "") {
  EngineClientOptions o;
  o.token = std::move(token);
  o.connect_timeout = comm::Millis(1000);
  o.request_timeout = comm::Millis(2000);
  o.data_timeout = comm::Millis(2000);
  return o;
}

TEST(EngineClient, SendsSchemaBodiesWithTheBearerToken) {
  Server s;
  std::string auth, body;
  s.http().Post("/begin_weight_update", [&](const httplib::Request& req, httplib::Response& res) {
    auth = req.get_header_value("Authorization");
    body = req.body;
    res.set_content(
        to_json_string(BeginWeightUpdateResponse{true, "", Selector::kTarget, "", "", "", ""}),
        "application/json");
  });
  EngineClient client(s.url() + "/", fast("s3cret"));
  EXPECT_EQ(client.url(), s.url());
  const auto answer = client.begin_weight_update({Selector::kTarget});
  EXPECT_EQ(answer.selector, Selector::kTarget);
  EXPECT_EQ(auth, "Bearer s3cret");
  EXPECT_EQ(parse_begin_weight_update(body).selector, Selector::kTarget);
}

TEST(EngineClient, ReadsServerInfoAndChecksums) {
  Server s;
  ServerInfoResponse info;
  info.version = "0.1.0";
  info.rank_count = 2;
  info.selectors = {Selector::kAll, Selector::kTarget};
  info.weight_version = "4";
  s.http().Get("/server_info", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(to_json_string(info), "application/json");
  });
  std::string runner;
  s.http().Get("/weights_checksum", [&](const httplib::Request& req, httplib::Response& res) {
    runner = req.get_param_value("runner");
    WeightsChecksumResponse r;
    r.runner = Runner::kDraft;
    r.weight_version = "4";
    r.digest = std::string(32, 'a');
    res.set_content(to_json_string(r), "application/json");
  });
  EngineClient client(s.url(), fast());
  EXPECT_EQ(client.server_info(), info);
  EXPECT_EQ(client.weights_checksum(Runner::kDraft).runner, Runner::kDraft);
  EXPECT_EQ(runner, "draft");
}

TEST(EngineClient, RecomputedChecksumIsAskedForAndMustBeConfirmed) {
  Server s;
  std::string recompute;
  bool confirm = true;
  s.http().Get("/weights_checksum", [&](const httplib::Request& req, httplib::Response& res) {
    recompute = req.get_param_value("recompute");
    WeightsChecksumResponse r;
    r.runner = Runner::kTarget;
    r.weight_version = "1";
    r.digest = std::string(32, 'a');
    auto body = nlohmann::json::parse(to_json_string(r));
    if (confirm) body["recomputed"] = true;
    res.set_content(body.dump(), "application/json");
  });
  EngineClient client(s.url(), fast());
  EXPECT_EQ(client.weights_checksum(Runner::kTarget, /*recompute=*/true).digest,
            std::string(32, 'a'));
  EXPECT_EQ(recompute, "1");
  client.weights_checksum(Runner::kTarget);
  EXPECT_EQ(recompute, "");
  // An engine that ignored the parameter answered with its stored digests.
  confirm = false;
  try {
    client.weights_checksum(Runner::kTarget, /*recompute=*/true);
    ADD_FAILURE() << "an unconfirmed recompute was accepted";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("recomputed"), std::string::npos) << e.what();
  }
}

TEST(EngineClient, ErrorsNameEngineRouteAndEngineMessage) {
  Server s;
  s.http().Post("/update_weights_from_distributed", [](const httplib::Request&,
                                                       httplib::Response& res) {
    res.status = 409;
    res.set_content(to_json_string(BasicResponse{false, "selector differs"}), "application/json");
  });
  EngineClient client(s.url(), fast());
  UpdateWeightsFromDistributedRequest req;
  req.tensors = {TensorMeta{"w", DType::kFloat32, {2}}};
  try {
    client.update_weights_from_distributed(req);
    FAIL() << "expected EngineError";
  } catch (const EngineError& e) {
    EXPECT_EQ(e.peer(), s.url());
    EXPECT_EQ(e.status(), 409);
    EXPECT_EQ(e.route(), "POST /update_weights_from_distributed");
    const std::string what = e.what();
    EXPECT_NE(what.find(s.url()), std::string::npos) << what;
    EXPECT_NE(what.find("/update_weights_from_distributed"), std::string::npos) << what;
    EXPECT_NE(what.find("selector differs"), std::string::npos) << what;
  }
}

TEST(EngineClient, SuccessFalseIsAnError) {
  Server s;
  s.http().Post("/pause_generation", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(to_json_string(BasicResponse{false, "busy"}), "application/json");
  });
  EngineClient client(s.url(), fast());
  EXPECT_THROW(client.pause_generation({}), EngineError);
}

TEST(EngineClient, SlowAnswerIsATimeout) {
  Server s;
  std::atomic<bool> release{false};
  s.http().Post("/end_weight_update", [&](const httplib::Request&, httplib::Response& res) {
    for (int i = 0; i < 100 && !release; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    res.set_content(to_json_string(EndWeightUpdateResponse{}), "application/json");
  });
  EngineClientOptions o = fast();
  o.request_timeout = comm::Millis(300);
  EngineClient client(s.url(), o);
  const auto start = std::chrono::steady_clock::now();
  try {
    client.end_weight_update({});
    FAIL() << "expected TimeoutError";
  } catch (const comm::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("/end_weight_update"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(s.url()), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  release = true;
}

TEST(EngineClient, ClosedPortIsAnUnreachableEngine) {
  std::string url;
  {
    Server s;
    url = s.url();
    s.stop();
  }
  EngineClient client(url, fast());
  try {
    client.health();
    FAIL() << "expected EngineError";
  } catch (const EngineError& e) {
    EXPECT_TRUE(e.unreachable());
    EXPECT_EQ(e.peer(), url);
  }
}

TEST(EngineClient, OversizedAnswerIsRefused) {
  Server s;
  s.http().Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(4096, 'x'), "text/plain");
  });
  EngineClientOptions o = fast();
  o.limits.max_body_bytes = 1024;
  EngineClient client(s.url(), o);
  EXPECT_THROW(client.metrics(), EngineError);
}

TEST(EngineClient, RejectsUrlsWithoutScheme) {
  EXPECT_THROW(EngineClient("127.0.0.1:30000", fast()), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync::trainer
