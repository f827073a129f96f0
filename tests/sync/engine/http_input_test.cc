// Malformed input over HTTP: each bad body gets a 4xx naming the field and changes nothing.
// Also 404/405/413, auth across the route table, and the route table's own rules.
#include "comm/errors.h"
#include "tests/sync/engine/http_fixture.h"

namespace weightcast::sync::engine::testing {
namespace {

struct BadInput {
  std::string path;
  std::string body;
  int status;
  std::string field;  // must appear in the message
};

std::string bucket_json(const std::string& names, const std::string& dtypes,
                        const std::string& shapes, const std::string& extra = "") {
  return R"({"names":)" + names + R"(,"dtypes":)" + dtypes + R"(,"shapes":)" + shapes +
         R"(,"group_name":"g","selector":"target","sequence":0)" + extra + "}";
}

// An init body for world size 2; an empty `address` leaves master_address out.
std::string init_json(const std::string& address, int port, int rank_offset,
                      const std::string& backend = "gloo", const std::string& extra = "") {
  const std::string head = address.empty() ? "{" : R"({"master_address":")" + address + "\",";
  return head + R"("master_port":)" + std::to_string(port) + R"(,"rank_offset":)" +
         std::to_string(rank_offset) + R"(,"world_size":2,"backend":")" + backend + "\"" + extra +
         "}";
}

class BadInputTest : public EngineHttpFixture {};

TEST_F(BadInputTest, EachMalformedBodyIsRefusedNamingTheFieldWithNoEffect) {
  EngineOptions opts;
  opts.max_bucket_bytes = 64 << 10;
  start(opts);
  join("g");
  ASSERT_EQ(post("/begin_weight_update", R"({"selector":"target"})").first, 200);
  const Snapshot before = snapshot();
  const std::string a = R"(["model.a"])", bf16 = R"(["bfloat16"])", s = "[[32,64]]";
  const std::string local = "127.0.0.1";
  const std::vector<BadInput> table = {
      {"/init_weights_update_group", "not json", 400, ""},
      {"/init_weights_update_group", "[]", 400, ""},
      {"/init_weights_update_group", init_json("", 29500, 1), 400, "master_address"},
      {"/init_weights_update_group", init_json(local, 0, 1), 400, "master_port"},
      {"/init_weights_update_group", init_json(local, 70000, 1), 400, "master_port"},
      {"/init_weights_update_group", init_json(local, 29500, 0), 400, "rank_offset"},
      {"/init_weights_update_group", init_json(local, 29500, 2), 400, "rank_offset"},
      {"/init_weights_update_group", init_json(local, 29500, 1, "mpi"), 400, "backend"},
      {"/init_weights_update_group", init_json(local, 29500, 1, "gloo", R"(,"group_name":"a b")"),
       400, "group_name"},
      {"/destroy_weights_update_group", R"({"group_name":7})", 400, "group_name"},
      {"/pause_generation", R"({"mode":"later"})", 400, "mode"},
      {"/continue_generation", R"({"torch_empty_cache":"yes"})", 400, "torch_empty_cache"},
      {"/begin_weight_update", "{}", 400, "selector"},
      {"/begin_weight_update", R"({"selector":"both"})", 400, "selector"},
      {"/update_weight_version", "{}", 400, "new_version"},
      {"/update_weight_version", R"({"new_version":5})", 400, "new_version"},
      {"/update_weights_from_distributed", bucket_json(a, bf16, "[[32,64],[1]]"), 400, "shapes"},
      {"/update_weights_from_distributed", bucket_json(a, R"(["float128"])", s), 400, "dtypes[0]"},
      {"/update_weights_from_distributed", bucket_json(a, bf16, "[[32,-64]]"), 400, "shapes[0][1]"},
      {"/update_weights_from_distributed", bucket_json(a, bf16, s, R"(,"load_format":"pickle")"),
       400, "load_format"},
      {"/update_weights_from_distributed",
       R"({"names":["model.a"],"dtypes":["bfloat16"],"shapes":[[32,64]],"group_name":"g","selector":"target","sequence":-1})",
       400, "sequence"},
      {"/update_weights_from_distributed",
       R"({"names":["model.a"],"dtypes":["bfloat16"],"shapes":[[32,64]],"group_name":"g","selector":"most","sequence":0})",
       400, "selector"},
      {"/update_weights_from_distributed",
       bucket_json(R"(["model.a","model.a"])", R"(["bfloat16","bfloat16"])", "[[32,64],[32,64]]"),
       400, "names[1]"},
      // Valid JSON whose meaning the engine refuses: a shape other than the resident tensor's,
      // and a bucket over --max-bucket-bytes, both before anything is allocated or received.
      {"/update_weights_from_distributed", bucket_json(a, bf16, "[[64,32]]"), 400, "names[0]"},
      {"/update_weights_from_distributed", bucket_json(a, R"(["float32"])", s), 400, "names[0]"},
      {"/update_weights_from_distributed", bucket_json(R"(["model.big"])", bf16, "[[1024,1024]]"),
       400, "max-bucket-bytes"},
  };
  for (const auto& row : table) {
    SCOPED_TRACE(row.path + " " + row.body);
    auto [st, body] = post(row.path, row.body);
    EXPECT_EQ(st, row.status) << body.dump();
    EXPECT_EQ(body.value("success", true), false);
    const std::string message = body.value("message", "");
    EXPECT_NE(message.find(row.field), std::string::npos) << message;
    EXPECT_EQ(snapshot(), before);
  }
  EXPECT_EQ(source_->connects(), 1) << "no refused init may reach the data plane";
  // The session survived every refusal: a good bucket still goes through.
  const std::vector<RawTensor> sent = {tensor("model.a", {32, 64}, 3)};
  EXPECT_EQ(post("/update_weights_from_distributed", bucket_body(0, sent, Selector::kTarget)).first,
            200);
  EXPECT_EQ(post("/end_weight_update", "").first, 200);
}

TEST_F(BadInputTest, ChecksumQueryIsValidated) {
  start();
  EXPECT_EQ(get("/weights_checksum").first, 400);
  auto [st, body] = get("/weights_checksum?runner=verifier");
  EXPECT_EQ(st, 400);
  EXPECT_NE(body.value("message", "").find("runner"), std::string::npos);
}

TEST_F(BadInputTest, UnknownRouteWrongMethodAndOversizedBody) {
  start();
  auto [st404, b404] = get("/nope");
  EXPECT_EQ(st404, 404);
  EXPECT_EQ(b404.value("success", true), false);
  auto res = client_->Get("/begin_weight_update");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->get_header_value("Allow"), "POST");
  EXPECT_EQ(Json::parse(res->body).value("success", true), false);
  auto put = client_->Put("/health", "", "application/json");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 405);
  auto big = client_->Post("/begin_weight_update", std::string(2u << 20, ' '), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(Json::parse(big->body, nullptr, false).value("success", true), false);
}

TEST_F(BadInputTest, AuthAcrossTheRouteTable) {
  start({}, "s3cret");
  auto anonymous = std::make_unique<httplib::Client>(server_->host(), server_->port());
  anonymous->set_read_timeout(std::chrono::seconds(20));
  auto wrong = std::make_unique<httplib::Client>(server_->host(), server_->port());
  wrong->set_read_timeout(std::chrono::seconds(20));
  wrong->set_bearer_token_auth("s3cre7");
  std::vector<std::string> public_routes;
  const RouteTable table = engine_routes(*engine_);
  for (const Route& route : table.routes()) {
    if (route.auth == Auth::kPublic) public_routes.push_back(route.path);
    for (Method m : route.methods) {
      SCOPED_TRACE(std::string(to_string(m)) + " " + route.path);
      const std::string path =
          route.path == "/weights_checksum" ? route.path + "?runner=target" : route.path;
      auto call = [&](httplib::Client& c) {
        return m == Method::kGet ? c.Get(path.c_str())
                                 : c.Post(path.c_str(), "{}", "application/json");
      };
      auto none = call(*anonymous);
      auto bad = call(*wrong);
      auto good = call(*client_);
      ASSERT_TRUE(none && bad && good);
      if (route.auth == Auth::kToken) {
        EXPECT_EQ(none->status, 401);
        EXPECT_EQ(bad->status, 403);
        EXPECT_EQ(Json::parse(none->body).value("success", true), false);
      } else {
        EXPECT_EQ(none->status, 200);
        EXPECT_EQ(bad->status, 200);
      }
      EXPECT_NE(good->status, 401);
      EXPECT_NE(good->status, 403);
    }
  }
  EXPECT_EQ(public_routes, (std::vector<std::string>{"/health", "/metrics"}));
}

TEST(RouteTable, RefusesARouteWithoutAuthLevel) {
  RouteTable table;
  Route r{"/x", {Method::kGet}, {}, [](const Request&) { return Reply{}; }};
  EXPECT_THROW(table.add(r), comm::EnforceError);
  Route ok{"/x", {Method::kGet}, Auth::kPublic, [](const Request&) { return Reply{}; }};
  table.add(ok);
  EXPECT_THROW(table.add(ok), comm::EnforceError) << "duplicate path";
  EXPECT_THROW(table.add({"y", {Method::kGet}, Auth::kToken, ok.handler}), comm::EnforceError);
  EXPECT_THROW(table.add({"/z", {}, Auth::kToken, ok.handler}), comm::EnforceError);
  EXPECT_THROW(table.add({"/w", {Method::kGet}, Auth::kToken, nullptr}), comm::EnforceError);
}

}  // namespace
}  // namespace weightcast::sync::engine::testing
