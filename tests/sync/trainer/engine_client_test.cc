// EngineClient against an in-process HTTP server: routes and bodies from the shared schemas,
// the bearer token, and errors that name the engine and the route (engine message included),
// timeouts as TimeoutError, a closed port as an unreachable engine.
#include "sync/trainer/http/engine_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/errors.h"
#include "tests/support/time_bounds.h"
#include "tests/sync/trainer/http_test_server.h"

namespace weightcast::sync::trainer {
namespace {

using testing::fast_client_options;
using testing::HttpTestServer;

// An engine's checksum answer: a digest of 32 'a's.
WeightsChecksumResponse checksum(Runner runner, std::string version) {
  WeightsChecksumResponse r;
  r.runner = runner;
  r.weight_version = std::move(version);
  r.digest = std::string(32, 'a');
  return r;
}

TEST(EngineClient, SendsSchemaBodiesWithTheBearerToken) {
  HttpTestServer s;
  std::string auth, body;
  s.http().Post("/begin_weight_update", [&](const httplib::Request& req, httplib::Response& res) {
    auth = req.get_header_value("Authorization");
    body = req.body;
    res.set_content(to_json_string(BeginWeightUpdateResponse{true, "", Selector::kTarget, "", "",
                                                             "", "", "", 0, "", ""}),
                    "application/json");
  });
  EngineClient client(s.url() + "/", fast_client_options("s3cret"));
  EXPECT_EQ(client.url(), s.url());
  const auto answer = client.begin_weight_update({Selector::kTarget});
  EXPECT_EQ(answer.selector, Selector::kTarget);
  EXPECT_EQ(auth, "Bearer s3cret");
  EXPECT_EQ(parse_begin_weight_update(body).selector, Selector::kTarget);
}

TEST(EngineClient, ReadsServerInfoAndChecksums) {
  HttpTestServer s;
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
    res.set_content(to_json_string(checksum(Runner::kDraft, "4")), "application/json");
  });
  EngineClient client(s.url(), fast_client_options());
  EXPECT_EQ(client.server_info(), info);
  EXPECT_EQ(client.weights_checksum(Runner::kDraft).runner, Runner::kDraft);
  EXPECT_EQ(runner, "draft");
}

TEST(EngineClient, RecomputedChecksumIsAskedForAndMustBeConfirmed) {
  HttpTestServer s;
  std::string recompute;
  bool confirm = true;
  s.http().Get("/weights_checksum", [&](const httplib::Request& req, httplib::Response& res) {
    recompute = req.get_param_value("recompute");
    auto body = nlohmann::json::parse(to_json_string(checksum(Runner::kTarget, "1")));
    if (confirm) body["recomputed"] = true;
    res.set_content(body.dump(), "application/json");
  });
  EngineClient client(s.url(), fast_client_options());
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
  HttpTestServer s;
  s.http().Post("/update_weights_from_distributed", [](const httplib::Request&,
                                                       httplib::Response& res) {
    res.status = 409;
    res.set_content(to_json_string(BasicResponse{false, "selector differs"}), "application/json");
  });
  EngineClient client(s.url(), fast_client_options());
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
  HttpTestServer s;
  s.http().Post("/pause_generation", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(to_json_string(BasicResponse{false, "busy"}), "application/json");
  });
  EngineClient client(s.url(), fast_client_options());
  EXPECT_THROW(client.pause_generation({}), EngineError);
}

TEST(EngineClient, SlowAnswerIsATimeout) {
  HttpTestServer s;
  std::atomic<bool> release{false};
  s.http().Post("/end_weight_update", [&](const httplib::Request&, httplib::Response& res) {
    for (int i = 0; i < 100 && !release; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    res.set_content(to_json_string(EndWeightUpdateResponse{}), "application/json");
  });
  EngineClientOptions o = fast_client_options();
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
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            weightcast::testing::late_bound(o.request_timeout));
  release = true;
}

TEST(EngineClient, ClosedPortIsAnUnreachableEngine) {
  std::string url;
  {
    HttpTestServer s;
    url = s.url();
    s.stop();
  }
  EngineClient client(url, fast_client_options());
  try {
    client.health();
    FAIL() << "expected EngineError";
  } catch (const EngineError& e) {
    EXPECT_TRUE(e.unreachable());
    EXPECT_EQ(e.peer(), url);
  }
}

TEST(EngineClient, OversizedAnswerIsRefused) {
  HttpTestServer s;
  s.http().Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(4096, 'x'), "text/plain");
  });
  EngineClientOptions o = fast_client_options();
  o.limits.max_body_bytes = 1024;
  EngineClient client(s.url(), o);
  EXPECT_THROW(client.metrics(), EngineError);
}

TEST(EngineClient, RejectsUrlsWithoutScheme) {
  EXPECT_THROW(EngineClient("127.0.0.1:30000", fast_client_options()), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync::trainer
