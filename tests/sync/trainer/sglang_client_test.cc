// The trainer's SGLang dialect: EngineClient against an in-process server that answers like
// SGLang (no /server_info, {message, status} for pause, plain-text flush, begin/end without our
// fields, the version from /get_weight_version), the flavor detected or forced, and the readers
// of SGLang's answer shapes.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "comm/errors.h"
#include "sync/trainer/http/engine_client.h"
#include "sync/trainer/http/sglang_answers.h"
#include "tests/sync/trainer/http_test_server.h"

namespace weightcast::sync::trainer {
namespace {

// An SGLang-shaped HTTP server on an ephemeral port.
class SglangLike {
 public:
  SglangLike() {
    httplib::Server& http = server_.http();
    auto json = [](const char* body) {
      return [body](const httplib::Request&, httplib::Response& res) {
        res.set_content(body, "application/json");
      };
    };
    http.Get("/get_server_info", json(R"({"tp_size":4,"dp_size":1,"weight_version":"7",
                                        "speculative_algorithm":"EAGLE","version":"0.5"})"));
    http.Post("/pause_generation",
              json(R"({"message":"Generation paused successfully.","status":"ok"})"));
    http.Get("/flush_cache", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("Cache flushed.\n", "text/plain");
    });
    http.Post("/begin_weight_update", json(R"({"success":true,"message":"begin"})"));
    // SGLang answers a failed load with 400; a 2xx is success whatever its body says.
    http.Post("/update_weights_from_distributed",
              [this](const httplib::Request& req, httplib::Response& res) {
                last_bucket = req.body;
                res.status = fail_buckets ? 400 : 200;
                res.set_content(R"({"success":false,"message":"load failed"})", "application/json");
              });
    http.Post("/end_weight_update", json(R"({"success":true,"message":"end"})"));
    http.Get("/get_weight_version", json(R"({"weight_version":"8"})"));
    http.Get("/health", [](const httplib::Request&, httplib::Response&) {});
  }
  std::string url() const { return server_.url(); }
  std::string last_bucket;
  bool fail_buckets = true;

 private:
  testing::HttpTestServer server_;
};

TEST(SglangClient, DetectsTheFlavorAndReadsSGLangsAnswers) {
  SglangLike s;
  EngineClient client(s.url(), testing::fast_client_options());
  EXPECT_EQ(client.flavor(), EngineFlavor::kWeightcast);  // not known before server_info
  const ServerInfoResponse info = client.server_info();
  EXPECT_EQ(client.flavor(), EngineFlavor::kSglang);
  EXPECT_EQ(info.rank_count, 4);
  EXPECT_EQ(info.weight_version, "7");
  EXPECT_EQ(info.speculative_algorithm, "EAGLE");
  EXPECT_TRUE(info.runners.empty());
  EXPECT_NO_THROW(client.health());
  EXPECT_NO_THROW(client.pause_generation({PauseMode::kRetract}));
  EXPECT_EQ(client.flush_cache().message, "Cache flushed.");
  EXPECT_EQ(client.begin_weight_update({Selector::kTarget}).selector, Selector::kTarget);
  EXPECT_EQ(client.end_weight_update({}).weight_version, "8");
  EXPECT_THROW(client.weights_checksum(Runner::kTarget), EngineError);
}

TEST(SglangClient, TheStatusAloneDecidesAsMilesJudgesIt) {
  SglangLike s;
  EngineClientOptions o = testing::fast_client_options();
  o.flavor = EngineFlavor::kSglang;
  EngineClient client(s.url(), o);
  UpdateWeightsFromDistributedRequest req;
  req.tensors = {{"model.a", DType::kBFloat16, {4}}};
  req.load_format = LoadFormat::kPerTensor;
  try {
    client.update_weights_from_distributed(req);
    FAIL() << "a 400 was taken for success";
  } catch (const EngineError& e) {
    EXPECT_EQ(e.engine(), s.url());
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("load failed"), std::string::npos) << e.what();
  }
  s.fail_buckets = false;  // 200 with success:false in the body: success, as for Miles
  EXPECT_NO_THROW(client.update_weights_from_distributed(req));
  // Miles' body: no sequence, no load_format.
  EXPECT_EQ(s.last_bucket.find("sequence"), std::string::npos) << s.last_bucket;
  EXPECT_EQ(s.last_bucket.find("load_format"), std::string::npos) << s.last_bucket;
}

TEST(SglangClient, ABeginAnswering404MakesTheEngineSessionless) {
  testing::HttpTestServer server;
  httplib::Server& http = server.http();
  http.Get("/get_server_info", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"tp_size":1,"weight_version":"4"})", "application/json");
  });
  int begins = 0;
  http.Post("/begin_weight_update", [&](const httplib::Request&, httplib::Response& res) {
    ++begins;
    res.status = 404;
  });
  http.Get("/get_weight_version", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"weight_version":"5"})", "application/json");
  });
  EngineClient client(server.url(), testing::fast_client_options());
  client.server_info();
  EXPECT_TRUE(client.sessions());
  EXPECT_EQ(client.begin_weight_update({Selector::kTarget}).selector, Selector::kTarget);
  EXPECT_FALSE(client.sessions());
  client.begin_weight_update({Selector::kTarget});
  EXPECT_EQ(begins, 1);                                         // known now: not asked again
  EXPECT_EQ(client.end_weight_update({}).weight_version, "5");  // read back, no /end call
}

TEST(SglangClient, AForcedWeightcastFlavorIsNeverTakenForSGLang) {
  SglangLike s;
  EngineClientOptions o = testing::fast_client_options();
  o.flavor = EngineFlavor::kWeightcast;
  EngineClient client(s.url(), o);
  EXPECT_THROW(client.server_info(), EngineError);  // 404 on /server_info
  EXPECT_EQ(client.flavor(), EngineFlavor::kWeightcast);
}

TEST(SglangAnswers, Readers) {
  EXPECT_TRUE(read_sglang_answer("").success);
  EXPECT_EQ(read_sglang_answer("Cache flushed.\n").message, "Cache flushed.");
  EXPECT_TRUE(read_sglang_answer(R"({"success":false,"message":"x"})").success);
  EXPECT_EQ(read_sglang_answer(R"({"message":"m","status":"ok"})").message, "m");
  EXPECT_EQ(read_sglang_weight_version(R"({"weight_version":3})"), "3");
  EXPECT_EQ(read_sglang_weight_version("nope"), std::nullopt);
  EXPECT_THROW(read_sglang_server_info("[]", {}), comm::BadRequestError);
  EXPECT_THROW(read_sglang_server_info(R"({"tp_size":0})", {}), comm::BadRequestError);
  EXPECT_EQ(read_sglang_server_info("{}", {}).rank_count, 1);
}

}  // namespace
}  // namespace weightcast::sync::trainer
