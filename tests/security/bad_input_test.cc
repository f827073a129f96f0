// Malformed requests to every route of a real weightcast-engine process, while it holds a joined
// group and an open session: each gets a 4xx whose message names the problem, and the engine's
// state (session, selector, pause flag, version, groups, runner digests, counters) is unchanged.
// Then claims of huge sizes (a 1 TiB bucket, a 1 TiB Content-Length, a huge chunk) leave the
// engine's resident memory where it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "sync/engine/runners/weights.h"
#include "sync/model/model.h"
#include "tests/security/engine_process.h"
#include "tests/security/net_probe.h"
#include "tests/sync/engine/process_sender.h"

namespace weightcast::security {
namespace {

using namespace std::chrono_literals;
using sync::engine::testing::Sender;

struct Row {
  std::string method;
  std::string path;
  std::string body;
  int status;
  std::string needle;  // must appear in the message
};

// `base` with `key` set to the raw JSON text `raw` (which may be invalid on purpose).
std::string with(Json base, const std::string& key, const std::string& raw) {
  base.erase(key);
  std::string text = base.dump();
  text.pop_back();
  return text + (base.empty() ? "" : ",") + "\"" + key + "\":" + raw + "}";
}

std::string with(const std::string& base, const std::string& key, const std::string& raw) {
  return with(Json::parse(base), key, raw);
}

std::string without(Json base, const std::string& key) {
  base.erase(key);
  return base.dump();
}

// push_back throughout: a braced single element is ambiguous in nlohmann (copy or array).
Json bucket(const std::string& name, const std::string& dtype, const Json& shape) {
  Json b = {{"group_name", "g"}, {"selector", "target"}, {"sequence", 0}};
  b["names"].push_back(name);
  b["dtypes"].push_back(dtype);
  b["shapes"].push_back(shape);
  return b;
}

// One refused POST to `path` for each raw JSON value of `key` in `bad` set into `base`; the
// message must name `key`.
void add_bad_values(std::vector<Row>& rows, const std::string& path, const Json& base,
                    const std::string& key, const std::vector<std::string>& bad) {
  for (const std::string& raw : bad) rows.push_back({"POST", path, with(base, key, raw), 400, key});
}

// Whether the engine answers the raw HTTP `request`, sent on `conn`, within `wait` with a
// response that starts with `start` (the status line, or a prefix of it).
::testing::AssertionResult answers(RawConnection& conn, const std::string& request,
                                   const std::string& start, std::chrono::milliseconds wait) {
  if (!conn.connected()) return ::testing::AssertionFailure() << "could not connect";
  if (!conn.send(request)) return ::testing::AssertionFailure() << "the send failed";
  const std::string answer = conn.read_http_response(wait);
  if (answer.rfind(start, 0) != 0) return ::testing::AssertionFailure() << answer;
  return ::testing::AssertionSuccess();
}

// Every row is refused, so `master_port` (a listener of the test) must never be dialled.
std::vector<Row> init_rows(int master_port) {
  const std::string p = "/init_weights_update_group";
  const Json kInit = {{"master_address", "127.0.0.1"},
                      {"master_port", master_port},
                      {"rank_offset", 1},
                      {"world_size", 2},
                      {"group_name", "h"},
                      {"backend", "gloo"}};
  std::vector<Row> rows = {{"POST", p, "not json", 400, "body"},
                           {"POST", p, "[]", 400, "body"},
                           {"POST", p, "", 400, "body"}};
  for (const char* key : {"master_address", "master_port", "world_size"}) {
    rows.push_back({"POST", p, without(kInit, key), 400, key});
  }
  add_bad_values(rows, p, kInit, "master_port", {"\"29500\"", "0", "70000", "29500.5", "true"});
  add_bad_values(rows, p, kInit, "rank_offset", {"0", "2"});
  add_bad_values(rows, p, kInit, "world_size", {"-2", "4294967298"});
  add_bad_values(rows, p, kInit, "backend", {"\"mpi\"", "null"});
  add_bad_values(rows, p, kInit, "group_name",
                 {"\"a b\"", "\"\"", "\"" + std::string(1100, 'x') + "\""});
  add_bad_values(rows, p, kInit, "master_address",
                 {"\"127.0.0.1\\n\"", "\"" + std::string(300, 'a') + "\"", "[\"127.0.0.1\"]"});
  return rows;
}

std::vector<Row> small_route_rows() {
  return {
      {"POST", "/destroy_weights_update_group", R"({"group_name":7})", 400, "group_name"},
      {"POST", "/destroy_weights_update_group", R"({"group_name":null})", 400, "group_name"},
      {"POST", "/destroy_weights_update_group", R"({"group_name":""})", 400, "group_name"},
      {"POST", "/destroy_weights_update_group", "[1]", 400, "body"},
      {"POST", "/destroy_weights_update_group", R"({"group_name":"nope"})", 400, "does not exist"},
      {"POST", "/pause_generation", R"({"mode":"later"})", 400, "mode"},
      {"POST", "/pause_generation", R"({"mode":1})", 400, "mode"},
      {"POST", "/pause_generation", R"({"mode":["abort"]})", 400, "mode"},
      {"POST", "/pause_generation", "x", 400, "body"},
      {"POST", "/continue_generation", R"({"torch_empty_cache":"yes"})", 400, "torch_empty_cache"},
      {"POST", "/continue_generation", R"({"torch_empty_cache":1})", 400, "torch_empty_cache"},
      {"POST", "/continue_generation", "[]", 400, "body"},
      {"POST", "/flush_cache", "[]", 400, "body"},
      {"POST", "/flush_cache", "{", 400, "body"},
      {"POST", "/begin_weight_update", "{}", 400, "selector"},
      {"POST", "/begin_weight_update", "", 400, "body"},
      {"POST", "/begin_weight_update", R"({"selector":"both"})", 400, "selector"},
      {"POST", "/begin_weight_update", R"({"selector":"TARGET"})", 400, "selector"},
      {"POST", "/begin_weight_update", R"({"selector":1})", 400, "selector"},
      {"POST", "/begin_weight_update", R"({"selector":null})", 400, "selector"},
      {"POST", "/begin_weight_update", R"({"selector":"all"})", 400,
       "session"},  // SGLang's dialect
      {"POST", "/update_weight_version", "{}", 400, "new_version"},
      {"POST", "/update_weight_version", R"({"new_version":5})", 400, "new_version"},
      {"POST", "/update_weight_version", R"({"new_version":""})", 400, "new_version"},
      {"POST", "/update_weight_version", R"({"new_version":"a\u0001b"})", 400, "new_version"},
      {"POST", "/update_weight_version", R"({"new_version":")" + std::string(300, '7') + R"("})",
       400, "new_version"},
      {"POST", "/update_weight_version", R"({"new_version":"8","abort_all_requests":"no"})", 400,
       "abort_all_requests"},
      // A malformed end or abort must neither commit nor drop the open session.
      {"POST", "/end_weight_update", "[]", 400, "body"},
      {"POST", "/end_weight_update", "{", 400, "body"},
      {"POST", "/abort_weight_update", "nope", 400, "body"},
      {"POST", "/abort_weight_update", "[]", 400, "body"},
      {"GET", "/weights_checksum", "", 400, "runner"},
      {"GET", "/weights_checksum?runner=verifier", "", 400, "runner"},
      {"GET", "/weights_checksum?runner=", "", 400, "runner"},
      {"GET", "/weights_checksum?runner=%FF%FE", "", 400, "runner"},
      {"GET", "/nope", "", 404, "/nope"},
      {"POST", "/health", "{}", 405, "POST"},
      {"POST", "/server_info", "{}", 405, "POST"},
      {"POST", "/get_server_info", "{}", 405, "POST"},
      {"POST", "/weights_checksum", "{}", 405, "POST"},
      {"POST", "/spec_accept_length", "{}", 405, "POST"},
      {"POST", "/metrics", "{}", 405, "POST"},
      {"GET", "/begin_weight_update", "", 405, "GET"},
      {"PUT", "/flush_cache", "{}", 405, "PUT"},
      {"DELETE", "/abort_weight_update", "", 405, "DELETE"},
  };
}

// `resident`: a tensor the target holds (name, dtype, shape), for the rows the engine refuses
// after parsing because they contradict its weights.
std::vector<Row> bucket_rows(const Json& resident) {
  const std::string p = "/update_weights_from_distributed";
  const Json b = bucket("model.new", "bfloat16", Json::array({32, 64}));
  const std::string name = resident["name"].get<std::string>();
  Json swapped = resident["shape"];
  std::reverse(swapped.begin(), swapped.end());
  Json two = bucket("model.x", "float32", Json::array({10 << 20}));  // 40 MiB each
  two["names"].push_back("model.y");
  two["dtypes"].push_back("float32");
  two["shapes"].push_back(Json::array({10 << 20}));
  return {
      {"POST", p, with(b, "dtypes", R"(["bfloat16","bfloat16"])"), 400, "dtypes"},
      {"POST", p, with(b, "shapes", "[[32,64],[1]]"), 400, "shapes"},
      {"POST", p, with(b, "names", "[]"), 400, "names"},
      {"POST", p, with(b, "names", R"("model.new")"), 400, "names"},
      {"POST", p, with(b, "names", "[1]"), 400, "names[0]"},
      {"POST", p, with(b, "names", R"(["model new"])"), 400, "names[0]"},
      {"POST", p, without(b, "names"), 400, "names"},
      {"POST", p, without(b, "shapes"), 400, "shapes"},
      {"POST", p, with(b, "dtypes", R"(["float128"])"), 400, "dtypes[0]"},
      {"POST", p, with(b, "dtypes", "[7]"), 400, "dtypes[0]"},
      {"POST", p, with(b, "shapes", "[[32,-64]]"), 400, "shapes[0][1]"},
      {"POST", p, with(b, "shapes", "[[4611686018427387904,4611686018427387904]]"), 400,
       "shapes[0]"},
      {"POST", p, with(b, "shapes", "[[9223372036854775808]]"), 400, "shapes[0][0]"},
      {"POST", p, with(b, "shapes", "[" + Json(std::vector<int>(65, 1)).dump() + "]"), 400,
       "shapes[0]"},
      {"POST", p, with(b, "shapes", "[[1.5]]"), 400, "shapes[0][0]"},
      {"POST", p, with(b, "shapes", R"([["4"]])"), 400, "shapes[0][0]"},
      {"POST", p, with(b, "shapes", "[5]"), 400, "shapes[0]"},
      {"POST", p,
       with(with(with(b, "names", R"(["model.n","model.n"])"), "dtypes",
                 R"(["bfloat16","bfloat16"])"),
            "shapes", "[[2],[2]]"),
       400, "names[1]"},
      {"POST", p, with(b, "selector", R"("most")"), 400, "selector"},
      {"POST", p, with(b, "selector", R"("all")"), 409, "selector"},
      {"POST", p, with(b, "sequence", "-1"), 400, "sequence"},
      {"POST", p, with(b, "sequence", R"("0")"), 400, "sequence"},
      {"POST", p, with(b, "sequence", "1.0"), 400, "sequence"},
      {"POST", p, with(b, "load_format", R"("pickle")"), 400, "load_format"},
      {"POST", p, with(b, "weight_version", "5"), 400, "weight_version"},
      {"POST", p, with(b, "flush_cache", R"("no")"), 400, "flush_cache"},
      {"POST", p, with(b, "group_name", R"("")"), 400, "group_name"},
      {"POST", p, with(b, "group_name", R"("nope")"), 409, "group_name"},
      // Over --max-bucket-bytes (64 MiB): one 256 MiB tensor, a 1 TiB one, and two that only
      // exceed it together.
      {"POST", p, bucket("model.big", "float32", Json::array({8192, 8192})).dump(), 400,
       "exceeds the limit"},
      {"POST", p, bucket("model.huge", "bfloat16", Json::array({std::int64_t{1} << 39})).dump(),
       400, "shapes[0]"},
      {"POST", p, two.dump(), 400, "shapes[1]"},
      // Valid JSON that contradicts the resident weights.
      {"POST", p, bucket(name, resident["dtype"].get<std::string>(), swapped).dump(), 400,
       "names[0]"},
      {"POST", p,
       bucket(name, resident["dtype"] == "float32" ? "bfloat16" : "float32", resident["shape"])
           .dump(),
       400, "names[0]"},
  };
}

std::vector<Row> hostile_body_rows() {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  const std::string very_deep = std::string(200000, '[') + std::string(200000, ']');
  return {
      {"POST", "/begin_weight_update", R"({"selector":)" + deep + "}", 400, "nested"},
      {"POST", "/pause_generation", R"({"x":)" + very_deep + "}", 400, "nested"},
      {"POST", "/update_weights_from_distributed", R"({"names":)" + deep + "}", 400, "nested"},
      {"POST", "/begin_weight_update", "{\"selector\":\"\xff\"}", 400, "UTF-8"},
      {"POST", "/begin_weight_update", "{\"selector\":\"\xc0\xaf\"}", 400, "UTF-8"},
      {"POST", "/update_weight_version", "{\"new_version\":\"\xed\xa0\x80\"}", 400, "UTF-8"},
      {"POST", "/init_weights_update_group", "{\"master_address\":\"\xf4\x90\x80\x80\"}", 400,
       "UTF-8"},
      {"POST", "/begin_weight_update", R"({"selector":"target","selector":"all"})", 400,
       "duplicate"},
      {"POST", "/destroy_weights_update_group", R"({"group_name":"g","group_name":"h"})", 400,
       "duplicate"},
      {"POST", "/begin_weight_update", std::string((1 << 20) + 1, ' '), 413, "payload too large"},
      {"POST", "/update_weights_from_distributed", "{\"names\":[\"" + std::string(1 << 20, 'a'),
       413, "payload too large"},
  };
}

TEST(SecurityBadInput, EveryRouteRefusesMalformedInputNamingItAndNothingChanges) {
  EngineProcess engine({"--max-bucket-bytes", "64M", "--max-body-bytes", "1M"});
  Sender sender({{engine.host(), engine.port(), 1}}, "g", 10s);
  const auto joined = sender.init();
  ASSERT_EQ(joined.at(0).status, 200) << joined.at(0).body.dump();
  ASSERT_EQ(engine.post("/begin_weight_update", R"({"selector":"target"})").status, 200);
  const HttpReply checksum = engine.get("/weights_checksum?runner=target");
  ASSERT_EQ(checksum.status, 200);
  // A resident matrix whose transpose has another shape, for the shape-mismatch row.
  Json resident;
  for (const auto& t : checksum.json["tensors"]) {
    const Json& shape = t["shape"];
    if (shape.size() == 2 && shape[0] != shape[1]) resident = t;
  }
  ASSERT_TRUE(resident.is_object()) << checksum.body.substr(0, 300);
  const EngineState before = engine.state();
  ASSERT_TRUE(before.in_session);

  Listener master("127.0.0.1");
  std::vector<Row> table = init_rows(master.port());
  for (auto rows : {small_route_rows(), bucket_rows(resident), hostile_body_rows()}) {
    table.insert(table.end(), rows.begin(), rows.end());
  }
  std::set<std::string> routes_hit;
  for (const Row& row : table) {
    SCOPED_TRACE(row.method + " " + row.path + " " + row.body.substr(0, 160));
    const HttpReply reply = engine.call(row.method, row.path, row.body, "");
    EXPECT_EQ(reply.status, row.status) << reply.body.substr(0, 400);
    ASSERT_TRUE(reply.json.is_object()) << "every refusal is JSON: " << reply.body.substr(0, 200);
    EXPECT_EQ(reply.json.value("success", true), false);
    EXPECT_NE(reply.message().find(row.needle), std::string::npos) << reply.message();
    EXPECT_EQ(engine.state(), before);
    routes_hit.insert(row.path.substr(0, row.path.find('?')));
  }
  // Every route of the engine appears in the table (the auth test walks the route table itself).
  for (const char* path :
       {"/init_weights_update_group", "/destroy_weights_update_group", "/pause_generation",
        "/continue_generation", "/flush_cache", "/begin_weight_update",
        "/update_weights_from_distributed", "/update_weight_version", "/end_weight_update",
        "/abort_weight_update", "/health", "/server_info", "/get_server_info", "/weights_checksum",
        "/spec_accept_length", "/metrics"}) {
    EXPECT_TRUE(routes_hit.count(path)) << path << " has no malformed-input row";
  }
  EXPECT_FALSE(master.accepted_within(100ms)) << "a refused init dialled its master";
  std::printf("[figure] malformed requests refused with no state change: %zu\n", table.size());

  // The engine still works after all of it: the open session aborts cleanly and a full update
  // goes through the same group.
  ASSERT_EQ(engine.post("/abort_weight_update", "").status, 200);
  const auto tensors = sync::engine::generate_weights(
      sync::target_tensors(sync::model_preset("tiny")), /*seed=*/9, /*step=*/1);
  for (const auto& r : sender.update(sync::Selector::kTarget, tensors, 256 << 10, "after-abuse")) {
    EXPECT_EQ(r.status, 200) << r.body.dump();
  }
  const EngineState after = engine.state();
  EXPECT_EQ(after.weight_version, "after-abuse");
  EXPECT_NE(after.target_digest, before.target_digest);
  EXPECT_EQ(after.draft_digest, before.draft_digest);
}

// Requests claiming huge sizes are refused before anything of that size is allocated: the
// engine's resident memory stays within a few MiB of where it was.
TEST(SecurityBadInput, HugeClaimsDoNotGrowTheEnginesMemory) {
  EngineProcess engine({"--http-timeout-ms", "2000"});
  ASSERT_EQ(engine.post("/begin_weight_update", R"({"selector":"target"})").status, 200);
  const EngineState before = engine.state();
  const std::size_t rss_before = resident_bytes(engine.pid());
  ASSERT_GT(rss_before, 0u);

  // A 1 TiB bucket (default --max-bucket-bytes is 4 GiB), in one tensor and in 1024 of 1 GiB.
  auto one =
      engine.post("/update_weights_from_distributed",
                  bucket("model.huge", "bfloat16", Json::array({std::int64_t{1} << 39})).dump());
  EXPECT_EQ(one.status, 400) << one.body;
  Json many = {{"group_name", "g"}, {"selector", "target"}, {"sequence", 0}};
  for (int i = 0; i < 1024; ++i) {
    many["names"].push_back("model.t" + std::to_string(i));
    many["dtypes"].push_back("uint8");
    many["shapes"].push_back(Json::array({1 << 30}));
  }
  auto split = engine.post("/update_weights_from_distributed", many.dump());
  EXPECT_EQ(split.status, 400) << split.body.substr(0, 300);
  EXPECT_NE(split.message().find("exceeds the limit"), std::string::npos) << split.message();

  // A group of 2^31 - 1 ranks with this engine as the last one, through a real store: the join
  // times out waiting for rank 0 without sizing anything by the world size.
  StoreProcess store({});
  auto ranks = engine.post(
      "/init_weights_update_group",
      R"({"master_address":"127.0.0.1","master_port":)" + std::to_string(store.port) +
          R"(,"rank_offset":2147483646,"world_size":2147483647,"group_name":"huge","backend":"gloo"})");
  EXPECT_EQ(ranks.status, 400) << ranks.body;  // the join's timeout, in SGLang's dialect
  EXPECT_NE(ranks.body.find("did not form within"), std::string::npos) << ranks.body;

  // A 1 TiB Content-Length with no body behind it: 413 at once, before any body is read.
  RawConnection claim(engine.host(), engine.port());
  ASSERT_TRUE(answers(claim,
                      "POST /begin_weight_update HTTP/1.1\r\nHost: x\r\n"
                      "Content-Type: application/json\r\nContent-Length: 1099511627776\r\n\r\n",
                      "HTTP/1.1 413", 5s));

  // A chunked body whose first chunk claims 1 TiB.
  RawConnection chunked(engine.host(), engine.port());
  ASSERT_TRUE(answers(chunked,
                      "POST /pause_generation HTTP/1.1\r\nHost: x\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n10000000000\r\n{\"mode\":",
                      "HTTP/1.1 4", 10s));
  EXPECT_TRUE(chunked.closed_within(5s));

  const std::size_t rss_after = resident_bytes(engine.pid());
  std::printf("[figure] engine RSS before %zu KiB, after 1 TiB claims %zu KiB\n", rss_before >> 10,
              rss_after >> 10);
  EXPECT_LT(rss_after, rss_before + (std::size_t{16} << 20));
  EXPECT_EQ(engine.state(), before);
  EXPECT_EQ(engine.get("/health").status, 200);
}

}  // namespace
}  // namespace weightcast::security
