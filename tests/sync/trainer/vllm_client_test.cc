// The trainer's vLLM dialect and the flavor detection: EngineClient against in-process servers
// that answer as vLLM's dev-mode routes do (vllm_config in /server_info, {"message"} answers,
// FastAPI's {"detail"} on failure), as SGLang's canonical /server_info does (with and without
// the weightcast plug-in's announce), and as weightcast's own engines do.
#include <gtest/gtest.h>
#include <httplib.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "comm/errors.h"
#include "sync/trainer/engine_client.h"
#include "sync/trainer/server_info_answers.h"
#include "sync/trainer/vllm_client.h"
#include "tests/sync/trainer/http_test_server.h"

namespace weightcast::sync::trainer {
namespace {

using Json = nlohmann::json;

constexpr const char* kVllmInfo =
    R"({"vllm_config":{"weight_transfer_config":{"backend":"weightcast"},
        "parallel_config":{"tensor_parallel_size":2},"speculative_config":null},
        "vllm_env":{},"system_env":{}})";

// A vLLM-shaped server (dev mode, weightcast backend) that records every request it gets.
class VllmLike {
 public:
  explicit VllmLike(std::string server_info = kVllmInfo) : info_(std::move(server_info)) {
    httplib::Server& http = server_.http();
    http.Get("/server_info", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      res.set_content(info_, "application/json");
    });
    http.Get("/get_world_size", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      res.set_content(R"({"world_size":2})", "application/json");
    });
    http.Get("/weight_info", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      res.set_content(Json{{"weight_version", version}}.dump(), "application/json");
    });
    for (const char* route :
         {"/init_weight_transfer_engine", "/start_weight_update", "/start_draft_weight_update",
          "/update_weights", "/finish_weight_update", "/pause", "/resume", "/reset_prefix_cache"}) {
      http.Post(route, [this](const httplib::Request& req, httplib::Response& res) {
        record(req);
        if (req.path == "/update_weights" && fail_updates) {
          res.status = 500;
          res.set_content(R"({"detail":"bucket failed"})", "application/json");
          return;
        }
        if (req.path == "/finish_weight_update") {
          version = Json::parse(req.body).value("weight_version", version);
        }
        res.set_content(R"({"message":"ok"})", "application/json");
      });
    }
  }
  std::string url() const { return server_.url(); }

  struct Seen {
    std::string method, target, body;
  };
  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

  std::string version = "default";
  bool fail_updates = false;

 private:
  void record(const httplib::Request& req) {
    std::string target = req.path;
    if (!req.params.empty()) {
      target += "?";
      for (const auto& [k, v] : req.params) target += k + "=" + v;
    }
    std::lock_guard lock(mu_);
    seen_.push_back({req.method, target, req.body});
  }

  std::string info_;
  std::mutex mu_;
  std::vector<Seen> seen_;
  testing::HttpTestServer server_;
};

UpdateWeightsFromDistributedRequest bucket() {
  UpdateWeightsFromDistributedRequest req;
  req.tensors = {{"model.norm.weight", DType::kBFloat16, {8}}};
  req.group_name = "weightcast-pp_0";
  req.selector = Selector::kTarget;
  req.sequence = 3;
  req.weight_version = "5";
  req.session_id = "vllm";
  req.digests = {"0123456789abcdef0123456789abcdef"};
  return req;
}

TEST(VllmClient, DetectsTheFlavorFromServerInfoAndReadsTheEngine) {
  VllmLike v;
  EngineClient client(v.url(), testing::fast_client_options());
  const ServerInfoResponse info = client.server_info();
  EXPECT_EQ(client.flavor(), EngineFlavor::kVllm);
  EXPECT_EQ(to_string(client.flavor()), "vllm");
  EXPECT_EQ(info.rank_count, 2);
  EXPECT_EQ(info.tp_size, 2);
  EXPECT_EQ(info.weight_version, "default");
  EXPECT_FALSE(info.speculative_algorithm);
  EXPECT_TRUE(info.runners.empty());  // real vLLM cannot describe them: --verify skips it
  EXPECT_EQ(info.selectors.size(), 3u);
}

TEST(VllmClient, MapsEveryCallOntoVllmsRoutesWithOurBodiesInside) {
  VllmLike v;
  EngineClient client(v.url(), testing::fast_client_options());
  client.server_info();

  InitWeightsUpdateGroupRequest init;
  init.master_address = "127.0.0.1";
  init.master_port = 29500;
  init.rank_offset = 1;
  init.world_size = 3;
  init.group_name = "weightcast-pp_0";
  init.backend = Backend::kGloo;
  client.init_weights_update_group(init);
  client.pause_generation({PauseMode::kRetract});
  client.flush_cache();
  const auto begun = client.begin_weight_update({Selector::kTarget});
  EXPECT_FALSE(begun.session_id.empty());    // the updater aborts sessions it holds an id of
  EXPECT_TRUE(begun.runner_digest.empty());  // no delta base: full buckets
  client.update_weights_from_distributed(bucket());
  client.update_weight_version({"5", false, begun.session_id});
  EXPECT_EQ(client.end_weight_update({begun.session_id}).weight_version, "5");
  client.continue_generation({});
  client.begin_weight_update({Selector::kDraft});
  client.abort_weight_update({begun.session_id, false});

  auto seen = v.seen();
  std::vector<std::string> targets;
  for (const auto& s : seen) targets.push_back(s.method + " " + s.target);
  const std::vector<std::string> expected = {"GET /server_info",
                                             "GET /get_world_size",
                                             "GET /weight_info",
                                             "POST /init_weight_transfer_engine",
                                             "POST /pause?mode=wait",
                                             "POST /reset_prefix_cache",
                                             "POST /start_weight_update",
                                             "POST /update_weights",
                                             "POST /finish_weight_update",
                                             "GET /weight_info",
                                             "POST /resume",
                                             "POST /start_draft_weight_update",
                                             "POST /update_weights"};
  EXPECT_EQ(targets, expected);

  const Json init_body = Json::parse(seen[3].body);
  ASSERT_TRUE(init_body.contains("init_info"));
  EXPECT_EQ(init_body["init_info"]["master_port"], 29500);
  EXPECT_EQ(init_body["init_info"]["rank_offset"], 1);
  EXPECT_EQ(init_body["init_info"]["group_name"], "weightcast-pp_0");
  EXPECT_EQ(init_body["init_info"]["backend"], "gloo");

  EXPECT_EQ(Json::parse(seen[6].body)["selector"], "target");
  const Json update = Json::parse(seen[7].body);
  ASSERT_TRUE(update.contains("update_info"));
  const Json& info = update["update_info"];
  EXPECT_EQ(info["names"], Json::array({"model.norm.weight"}));
  EXPECT_EQ(info["dtypes"], Json::array({"bfloat16"}));
  EXPECT_EQ(info["shapes"], Json::parse("[[8]]"));
  EXPECT_EQ(info["sequence"], 3);
  EXPECT_EQ(info["load_format"], "weightcast_bucket");
  EXPECT_EQ(info["digests"].size(), 1u);
  EXPECT_FALSE(info.contains("session_id"));
  EXPECT_EQ(Json::parse(seen[8].body), Json::parse(R"({"weight_version":"5"})"));
  EXPECT_EQ(Json::parse(seen[12].body)["update_info"]["abort"], true);
}

TEST(VllmClient, AFailedBucketIsAnEngineErrorWithVllmsDetail) {
  VllmLike v;
  v.fail_updates = true;
  EngineClientOptions o = testing::fast_client_options();
  o.flavor = EngineFlavor::kVllm;  // forced: no detection needed
  EngineClient client(v.url(), o);
  EXPECT_EQ(client.flavor(), EngineFlavor::kVllm);
  try {
    client.update_weights_from_distributed(bucket());
    FAIL() << "a 500 must throw";
  } catch (const EngineError& e) {
    EXPECT_EQ(e.status(), 500);
    EXPECT_NE(std::string(e.what()).find("bucket failed"), std::string::npos) << e.what();
  }
}

TEST(VllmClient, RefusesAnotherWeightTransferBackend) {
  VllmLike v(R"({"vllm_config":{"weight_transfer_config":{"backend":"nccl"}}})");
  EngineClient client(v.url(), testing::fast_client_options());
  EXPECT_THROW(client.server_info(), comm::ConfigError);
}

TEST(VllmClient, RefusesEnginesWithMoreWorkersThanTpRanks) {
  // /get_world_size answers 2 (TP 1 x PP 2): the workers' TP ranks would collide.
  VllmLike v(R"({"vllm_config":{"parallel_config":{"tensor_parallel_size":1}}})");
  EngineClient client(v.url(), testing::fast_client_options());
  EXPECT_THROW(client.server_info(), comm::ConfigError);
}

TEST(VllmClient, TextConfigIsReadAgainAsJson) {
  VllmLike v(R"({"vllm_config":"model='m', weight_transfer_config=..."})");
  EngineClient client(v.url(), testing::fast_client_options());
  client.server_info();
  const auto seen = v.seen();
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen[1].target, "/server_info?config_format=json");
}

TEST(VllmClient, ForcedVllmWithoutDevModeSaysSo) {
  testing::HttpTestServer bare;  // serves nothing: vLLM without VLLM_SERVER_DEV_MODE
  EngineClientOptions o = testing::fast_client_options();
  o.flavor = EngineFlavor::kVllm;
  EngineClient client(bare.url(), o);
  try {
    client.server_info();
    FAIL() << "a 404 must throw";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("VLLM_SERVER_DEV_MODE"), std::string::npos) << e.what();
  }
}

TEST(FlavorDetection, TellsTheEnginesApartByTheirServerInfo) {
  EXPECT_EQ(flavor_of_server_info(kVllmInfo), EngineFlavor::kVllm);
  EXPECT_EQ(flavor_of_server_info(R"({"success":true,"message":"ok","rank_count":1})"),
            EngineFlavor::kWeightcast);
  EXPECT_EQ(flavor_of_server_info(R"({"tp_size":2,"dp_size":1,"version":"0.5.6"})"),
            EngineFlavor::kSglang);
  // SGLang with the plug-in: its receivers are ours, its routes SGLang's.
  EXPECT_EQ(flavor_of_server_info(R"({"tp_size":2,"internal_states":[{"weightcast":
              {"version":"0.1.0","receiver":"weightcast.Receiver","native_routes":false}}]})"),
            EngineFlavor::kSglang);
  // An engine that serves our routes beside SGLang's and says so.
  EXPECT_EQ(flavor_of_server_info(R"({"tp_size":2,"weightcast":{"version":"0.1.0",
              "native_routes":true}})"),
            EngineFlavor::kWeightcast);
  EXPECT_THROW(flavor_of_server_info("[1]"), comm::BadRequestError);
}

TEST(FlavorDetection, ReadsTheReceiverAnnounce) {
  const auto announce = read_receiver_announce(
      R"({"internal_states":[{"x":1},{"weightcast":{"version":"0.1.0","receiver":"weightcast.Receiver",
          "runners":[{"name":"target","filters":["model.*"],"layout":"none","tensor_count":3}],
          "routes":["/weights_checksum"]}}]})",
      {});
  ASSERT_TRUE(announce);
  EXPECT_EQ(announce->version, "0.1.0");
  EXPECT_EQ(announce->receiver, "weightcast.Receiver");
  EXPECT_FALSE(announce->native_routes);
  ASSERT_EQ(announce->runners.size(), 1u);
  EXPECT_EQ(announce->runners[0].tensor_count, 3u);
  EXPECT_EQ(announce->routes, std::vector<std::string>{"/weights_checksum"});
  EXPECT_FALSE(read_receiver_announce(R"({"tp_size":1})", {}));
  EXPECT_THROW(read_receiver_announce(R"({"weightcast":{"receiver":"x"}})", {}),
               comm::BadRequestError);  // no version
}

TEST(FlavorDetection, SglangsCanonicalServerInfoWithTheAnnounce) {
  testing::HttpTestServer s;
  s.http().Get("/server_info", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"tp_size":2,"weight_version":"3","internal_states":[{"weightcast":
                      {"version":"0.1.0","receiver":"weightcast.Receiver"}}]})",
                    "application/json");
  });
  EngineClient client(s.url(), testing::fast_client_options());
  const auto info = client.server_info();
  EXPECT_EQ(client.flavor(), EngineFlavor::kSglang);
  EXPECT_EQ(info.rank_count, 2);
  EXPECT_EQ(info.weight_version, "3");
  EXPECT_EQ(info.message, "sglang with weightcast receiver 0.1.0");
}

TEST(FlavorDetection, ParsesTheFlavorNames) {
  EXPECT_EQ(parse_engine_flavor("vllm"), EngineFlavor::kVllm);
  EXPECT_EQ(parse_engine_flavor("sglang"), EngineFlavor::kSglang);
  EXPECT_EQ(parse_engine_flavor("weightcast"), EngineFlavor::kWeightcast);
  EXPECT_THROW(parse_engine_flavor("trtllm"), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync::trainer
