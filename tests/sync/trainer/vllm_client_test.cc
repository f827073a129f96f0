// The trainer's vLLM dialect and the flavor detection: EngineClient against in-process servers
// that answer as vLLM's dev-mode routes do (vllm_config in /server_info, {"message"} answers,
// FastAPI's {"detail"} on failure), as SGLang's canonical /server_info does (with and without
// the weightcast plug-in's announce), and as weightcast's own engines do.
#include <gtest/gtest.h>
#include <httplib.h>
#include <algorithm>

#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "comm/errors.h"
#include "sync/trainer/http/engine_client.h"
#include "sync/trainer/http/server_info_answers.h"
#include "sync/trainer/http/vllm_client.h"
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
          "/update_weights", "/finish_weight_update", "/pause", "/resume", "/reset_prefix_cache",
          "/collective_rpc", "/v1/load_lora_adapter"}) {
      http.Post(route, [this](const httplib::Request& req, httplib::Response& res) {
        record(req);
        if (req.path == "/update_weights" && raise_on_abort &&
            req.body.find("\"abort\"") != std::string::npos) {
          // The backend raises on an abort so vLLM's worker leaves its update (500 + detail).
          res.status = 500;
          res.set_content(R"({"detail":"weightcast: round aborted"})", "application/json");
          return;
        }
        if (req.path == "/v1/load_lora_adapter" && !lora_route) {
          res.status = 404;
          res.set_content(R"({"detail":"Not Found"})", "application/json");
          return;
        }
        if (req.path == "/update_weights" && fail_updates) {
          res.status = 500;
          res.set_content(R"({"detail":"bucket failed"})", "application/json");
          return;
        }
        if (req.path == "/finish_weight_update") {
          version = Json::parse(req.body).value("weight_version", version);
        }
        if (req.path == "/collective_rpc") {
          // Two workers, each answering as WeightcastWorkerExtension's methods do.
          const Json call = Json::parse(req.body);
          if (call["method"] == "weightcast_commit" && !call["args"].empty()) {
            version = call["args"][0];
          }
          Json one = {{"success", true}, {"message", "ok"}, {"weight_version", version}};
          // An adapter round: the adapter each worker's receiver holds, and the one it commits.
          if (call["method"] == "weightcast_begin" && call["args"].size() == 2) {
            one["lora_version"] = held_version;
            one["lora_digest"] = held_digest;
          }
          if (call["method"] == "weightcast_commit") one["lora_digest"] = "d-" + version;
          Json first = one;
          // The extension's commit of an adapter round: worker 0 answers where it wrote it.
          if (call["method"] == "weightcast_commit") first["lora_path"] = "/adapters/policy-1";
          if (!worker0_digest.empty()) first["lora_digest"] = worker0_digest;
          if (call["method"] == "weightcast_shard_plan" && announce_plans) {
            // Answers in another order than the ranks': each names its own.
            first["plan"] = {{"tensors", {{"model.norm.weight", "replicated"}, {"w", "r1"}}}};
            first["engine_rank"] = 1;
            one["plan"] = {{"tensors", {{"model.norm.weight", "replicated"}, {"w", "r0"}}}};
            one["engine_rank"] = 0;
          }
          res.set_content(Json{{"results", {first, one}}}.dump(), "application/json");
          return;
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
  bool raise_on_abort = false;
  bool lora_route = true;       // VLLM_ALLOW_RUNTIME_LORA_UPDATING
  bool announce_plans = false;  // the workers answer weightcast_shard_plan with plans
  // What the workers answer an adapter round's begin as the adapter they hold ("": none), and
  // a digest worker 0 answers instead of the others' ("": the same).
  std::string held_version, held_digest, worker0_digest;

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

// Group rank 1 of 3 behind a store at 127.0.0.1:29500.
InitWeightsUpdateGroupRequest init_request() {
  InitWeightsUpdateGroupRequest init;
  init.master_address = "127.0.0.1";
  init.master_port = 29500;
  init.rank_offset = 1;
  init.world_size = 3;
  return init;
}

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

  InitWeightsUpdateGroupRequest init = init_request();
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

namespace weightcast::sync::trainer {
namespace {

TEST(VllmClient, NoPendingVersionSendsNoWeightVersion) {
  // vLLM records whatever string /finish_weight_update gets, "" included.
  EXPECT_EQ(Json::parse(vllm_finish_body("")), Json::object());
  EXPECT_EQ(Json::parse(vllm_finish_body("7")), Json::parse(R"({"weight_version":"7"})"));
  VllmLike v;
  v.version = "3";
  EngineClient client(v.url(), testing::fast_client_options());
  client.server_info();
  const auto begun = client.begin_weight_update({Selector::kTarget});
  EXPECT_EQ(client.end_weight_update({begun.session_id}).weight_version, "3");
  EXPECT_EQ(v.seen().back().target, "/weight_info");
  const auto seen = v.seen();
  EXPECT_EQ(Json::parse(seen[seen.size() - 2].body), Json::object());
}

TEST(VllmClient, AnAbortTheBackendRaisesIsTheAbortsSuccess) {
  VllmLike v;
  v.raise_on_abort = true;
  EngineClient client(v.url(), testing::fast_client_options());
  client.server_info();
  const auto begun = client.begin_weight_update({Selector::kTarget});
  const auto answer = client.abort_weight_update({begun.session_id, false});
  EXPECT_TRUE(answer.success);
  EXPECT_NE(answer.message.find("round aborted"), std::string::npos) << answer.message;
}

TEST(VllmClient, AnAbortNobodyAnswersStaysAnError) {
  testing::HttpTestServer bare;
  const std::string url = bare.url();
  bare.stop();  // nobody listens there any more
  EngineClientOptions o = testing::fast_client_options();
  o.flavor = EngineFlavor::kVllm;
  EngineClient client(url, o);
  EXPECT_THROW(client.abort_weight_update({"vllm", false}), EngineError);
}

constexpr const char* kExtensionInfo =
    R"({"vllm_config":{"weight_transfer_config":null,
        "parallel_config":{"tensor_parallel_size":2,
                           "worker_extension_cls":"weightcast.vllm.WeightcastWorkerExtension"}}})";

TEST(VllmClient, TheWayInIsReadFromTheConfig) {
  EXPECT_EQ(read_vllm_way_in(kVllmInfo), VllmWayIn::kBackend);
  EXPECT_EQ(read_vllm_way_in(kExtensionInfo), VllmWayIn::kWorkerExtension);
  EXPECT_EQ(read_vllm_way_in(R"({"vllm_config":{}})"), VllmWayIn::kBackend);
  // Another backend beside our extension: the extension is the way in.
  EXPECT_EQ(read_vllm_way_in(R"({"vllm_config":{"weight_transfer_config":{"backend":"nccl"},
      "parallel_config":{"worker_extension_cls":"weightcast.vllm.WeightcastWorkerExtension"}}})"),
            VllmWayIn::kWorkerExtension);
  try {
    read_vllm_way_in(R"({"vllm_config":{"weight_transfer_config":{"backend":"nccl"}}})");
    FAIL() << "another backend without the extension must be refused";
  } catch (const comm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--worker-extension-cls"), std::string::npos) << e.what();
  }
}

TEST(VllmClient, TheWorkerExtensionIsDrivenThroughCollectiveRpc) {
  VllmLike v(kExtensionInfo);
  EngineClient client(v.url(), testing::fast_client_options());
  client.server_info();
  client.init_weights_update_group(init_request());
  const auto begun = client.begin_weight_update({Selector::kDraft});
  client.update_weights_from_distributed(bucket());
  client.update_weight_version({"5", false, begun.session_id});
  EXPECT_EQ(client.end_weight_update({begun.session_id}).weight_version, "5");
  client.begin_weight_update({Selector::kTarget});
  client.abort_weight_update({begun.session_id, false});

  std::vector<std::string> calls;
  std::vector<Json> bodies;
  for (const auto& s : v.seen()) {
    if (s.target != "/collective_rpc") continue;
    bodies.push_back(Json::parse(s.body));
    calls.push_back(bodies.back()["method"]);
  }
  const std::vector<std::string> expected = {
      "weightcast_shard_plan", "weightcast_version", "weightcast_init",
      "weightcast_begin",      "weightcast_update",  "weightcast_commit",
      "weightcast_version",    "weightcast_begin",   "weightcast_abort"};
  EXPECT_EQ(calls, expected);
  // vLLM passes string arguments only: our bodies travel as JSON text.
  EXPECT_EQ(Json::parse(bodies[2]["args"][0].get<std::string>())["master_port"], 29500);
  EXPECT_EQ(bodies[3]["args"], Json::array({"draft"}));
  const Json update = Json::parse(bodies[4]["args"][0].get<std::string>());
  EXPECT_EQ(update["names"], Json::array({"model.norm.weight"}));
  EXPECT_FALSE(update.contains("session_id"));
  EXPECT_EQ(bodies[5]["args"], Json::array({"5"}));
  for (const auto& s : v.seen()) {
    EXPECT_NE(s.target, "/start_weight_update");
    EXPECT_NE(s.target, "/update_weights");
  }
}

// Shard plans come through the extension, one per worker, ordered by the rank each names; a
// worker without a plan (its loader could not be followed, or an older extension) means none.
TEST(VllmClient, TheExtensionsShardPlansAreAnnouncedInRankOrder) {
  VllmLike v(kExtensionInfo);
  EngineClient without(v.url(), testing::fast_client_options());
  EXPECT_TRUE(without.server_info().shard_plans.empty());
  v.announce_plans = true;
  EngineClient client(v.url(), testing::fast_client_options());
  const auto info = client.server_info();
  ASSERT_EQ(info.shard_plans.size(), 2u);
  EXPECT_EQ(Json::parse(info.shard_plans[0])["tensors"]["w"], "r0");
  EXPECT_EQ(Json::parse(info.shard_plans[1])["tensors"]["w"], "r1");

  const Json plan = {{"tensors", Json::object()}};
  const std::vector<Json> two = {{{"plan", plan}, {"engine_rank", 0}},
                                 {{"plan", plan}, {"engine_rank", 1}}};
  EXPECT_EQ(read_vllm_shard_plans(two, 2).size(), 2u);
  EXPECT_TRUE(read_vllm_shard_plans(two, 3).empty());               // a worker did not answer
  EXPECT_TRUE(read_vllm_shard_plans({two[0], two[0]}, 2).empty());  // one rank twice
  EXPECT_TRUE(read_vllm_shard_plans({two[0], {{"plan", nullptr}, {"engine_rank", 1}}}, 2).empty());
  EXPECT_TRUE(read_vllm_shard_plans({two[0], {{"plan", plan}, {"engine_rank", 2}}}, 2).empty());
}

TEST(VllmClient, AdapterRoundsGoThroughTheExtensionAndVllmsRuntimeLoraRoute) {
  const std::string with_lora =
      R"({"vllm_config":{"parallel_config":{"tensor_parallel_size":2,
          "worker_extension_cls":"weightcast.vllm.WeightcastWorkerExtension"},
          "lora_config":{"max_lora_rank":16}}})";
  EXPECT_TRUE(read_vllm_lora_enabled(with_lora));
  EXPECT_FALSE(read_vllm_lora_enabled(kExtensionInfo));
  EXPECT_FALSE(read_vllm_lora_enabled(R"({"vllm_config":{"lora_config":null}})"));
  EXPECT_EQ(Json::parse(vllm_load_lora_body("policy", "/a/b")),
            (Json{{"lora_name", "policy"}, {"lora_path", "/a/b"}, {"load_inplace", true}}));

  VllmLike v(with_lora);
  v.version = "7";
  EngineClient client(v.url(), testing::fast_client_options());
  EXPECT_TRUE(client.server_info().lora);
  BeginWeightUpdateRequest begin{Selector::kTarget};
  begin.lora = LoraBegin{"policy", R"({"r":4,"lora_alpha":8,"target_modules":["q_proj"]})", true};
  const auto begun = client.begin_weight_update(begin);
  EXPECT_EQ(begun.weight_version, "7");  // the base's: an adapter commit must leave it
  EXPECT_EQ(begun.lora_version, "");     // no adapter held: no delta base
  client.update_weight_version({"1", false, begun.session_id});
  const auto ended = client.end_weight_update({begun.session_id});
  EXPECT_EQ(ended.weight_version, "1");  // this fake records what the commit carries
  EXPECT_EQ(ended.lora_digest, "d-1");   // what every worker committed
  // The adapter every worker holds is the base of the next round's deltas ...
  v.held_version = "1";
  v.held_digest = "d-1";
  const auto held = client.begin_weight_update(begin);
  EXPECT_EQ(held.lora_version, "1");
  EXPECT_EQ(held.lora_digest, "d-1");
  client.abort_weight_update({held.session_id, false});
  // ... unless the workers disagree: then none (whole buckets).
  v.worker0_digest = "d-other";
  const auto split = client.begin_weight_update(begin);
  EXPECT_EQ(split.lora_version, "");
  EXPECT_EQ(split.lora_digest, "");
  client.abort_weight_update({split.session_id, false});
  v.worker0_digest.clear();
  std::vector<Json> rpcs;
  Json load;
  for (const auto& s : v.seen()) {
    if (s.target == "/collective_rpc") rpcs.push_back(Json::parse(s.body));
    if (s.target == "/v1/load_lora_adapter") load = Json::parse(s.body);
  }
  const auto begin_call = std::find_if(
      rpcs.begin(), rpcs.end(), [](const Json& j) { return j["method"] == "weightcast_begin"; });
  ASSERT_NE(begin_call, rpcs.end());
  ASSERT_EQ((*begin_call)["args"].size(), 2u);
  EXPECT_EQ((*begin_call)["args"][0], "target");
  EXPECT_EQ(Json::parse((*begin_call)["args"][1].get<std::string>())["lora_name"], "policy");
  EXPECT_EQ(
      load,
      (Json{{"lora_name", "policy"}, {"lora_path", "/adapters/policy-1"}, {"load_inplace", true}}));

  // Without vLLM's run-time LoRA route the commit fails naming what to start vLLM with.
  v.lora_route = false;
  const auto again = client.begin_weight_update(begin);
  try {
    client.end_weight_update({again.session_id});
    FAIL() << "a commit vLLM could not load was taken for a success";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("VLLM_ALLOW_RUNTIME_LORA_UPDATING"), std::string::npos)
        << e.what();
  }
}

TEST(VllmClient, AdapterRoundsAreRefusedThroughTheBackend) {
  VllmLike v;
  EngineClient client(v.url(), testing::fast_client_options());
  EXPECT_FALSE(client.server_info().lora);
  BeginWeightUpdateRequest begin{Selector::kTarget};
  begin.lora = LoraBegin{"policy", R"({"r":4,"lora_alpha":8,"target_modules":["q_proj"]})", true};
  try {
    client.begin_weight_update(begin);
    FAIL() << "an adapter round through vLLM's weight-transfer API";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("worker extension"), std::string::npos) << e.what();
  }
  for (const auto& s : v.seen()) EXPECT_NE(s.target, "/start_weight_update");
}

}  // namespace
}  // namespace weightcast::sync::trainer
