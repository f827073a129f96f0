// Request bodies are read into the documented schema and nothing else: fields the schema does not
// define ("__proto__", "constructor", "$type", "@class", "py/object", ...) are ignored and change
// nothing, whatever they hold; tokens JSON does not have (NaN, Infinity, comments, single quotes)
// and numbers outside a field's type are refused; keys that only look alike (an embedded NUL) or
// are spelled differently but equal (\u escapes) are read exactly as JSON defines them. Store
// values are opaque bytes: what is set is what is read, byte for byte.
#include <gtest/gtest.h>

#include "comm/store/tcp_store.h"
#include "tests/security/engine_process.h"

namespace weightcast::security {
namespace {

using namespace std::chrono_literals;

// Fields that deserializers in other ecosystems turn into types, prototypes or calls.
const std::string kGadgets =
    R"("__proto__":{"selector":"all","mode":"abort","new_version":"evil","polluted":true},)"
    R"("constructor":{"prototype":{"selector":"all"}},"$type":"System.Diagnostics.Process",)"
    R"("@class":"java.lang.Runtime","py/object":"os.system","!!python/object/apply:os.system":)"
    R"(["id"],"__class__":"subprocess.Popen","$ref":"#/selector","rid":"req-1")";

TEST(SecuritySchema, UnknownAndGadgetFieldsAreIgnoredAndOnlyTheSchemaActs) {
  EngineProcess engine;
  const EngineState idle = engine.state();

  // Each accepted body does exactly what its schema fields say.
  auto begin = engine.post("/begin_weight_update", R"({"selector":"target",)" + kGadgets + "}");
  ASSERT_EQ(begin.status, 200) << begin.body;
  EXPECT_EQ(begin.json.value("selector", ""), "target");
  EngineState expected = idle;
  expected.in_session = true;
  expected.session_selector = "\"target\"";
  EXPECT_EQ(engine.state(), expected);
  ASSERT_EQ(engine.post("/abort_weight_update", "{" + kGadgets + "}").status, 200);
  expected = idle;
  expected.updates_failed = "1";  // an aborted session counts as a failed update
  EXPECT_EQ(engine.state(), expected);

  auto pause = engine.post("/pause_generation", R"({"mode":"in_place",)" + kGadgets + "}");
  ASSERT_EQ(pause.status, 200) << pause.body;
  EXPECT_TRUE(engine.state().paused);
  ASSERT_EQ(engine.post("/continue_generation", "{" + kGadgets + "}").status, 200);
  EXPECT_EQ(engine.state(), expected);

  auto version = engine.post("/update_weight_version", R"({"new_version":"7",)" + kGadgets + "}");
  ASSERT_EQ(version.status, 200) << version.body;
  EXPECT_EQ(engine.state().weight_version, "7");
  EXPECT_EQ(engine.get("/server_info").json.value("polluted", Json()), Json())
      << "no field appears that the schema does not define";

  // Unknown fields may hold anything within the depth limit; they are still ignored.
  auto nested = engine.post("/begin_weight_update",
                            R"({"selector":"draft","x":[[[[{"y":[1e308,-1e308,null]}]]]]})");
  ASSERT_EQ(nested.status, 200) << nested.body;
  EXPECT_EQ(engine.state().session_selector, "\"draft\"");
  ASSERT_EQ(engine.post("/abort_weight_update", "").status, 200);
}

TEST(SecuritySchema, KeysAreComparedExactlyAsJsonDefinesThem) {
  EngineProcess engine;
  // A key with an embedded NUL is another key, not "selector" cut short.
  auto nul = engine.post("/begin_weight_update", R"({"selector\u0000":"all","selector":"target"})");
  ASSERT_EQ(nul.status, 200) << nul.body;
  EXPECT_EQ(engine.state().session_selector, "\"target\"");
  ASSERT_EQ(engine.post("/abort_weight_update", "").status, 200);
  // An escaped spelling of the same key is the same key: a duplicate, so the body is refused
  // instead of two readers picking different values.
  const EngineState before = engine.state();
  auto escaped =
      engine.post("/begin_weight_update", R"({"selector":"target","\u0073elector":"all"})");
  EXPECT_EQ(escaped.status, 400) << escaped.body;
  EXPECT_NE(escaped.message().find("duplicate"), std::string::npos) << escaped.message();
  auto alone = engine.post("/begin_weight_update", R"({"\u0073elector":"draft"})");
  ASSERT_EQ(alone.status, 200) << alone.body;
  EXPECT_EQ(engine.state().session_selector, "\"draft\"");
  ASSERT_EQ(engine.post("/abort_weight_update", "").status, 200);
  EngineState expected = before;
  expected.updates_failed = "2";  // both sessions opened here were aborted
  EXPECT_EQ(engine.state(), expected);
  // Case matters: "Selector" is an unknown field, so the required one is missing.
  auto upper = engine.post("/begin_weight_update", R"({"Selector":"all"})");
  EXPECT_EQ(upper.status, 400);
  EXPECT_NE(upper.message().find("selector"), std::string::npos) << upper.message();
}

TEST(SecuritySchema, NonJsonTokensAndOutOfTypeNumbersAreRefusedWithNoEffect) {
  EngineProcess engine;
  const EngineState before = engine.state();
  const std::string init = "/init_weights_update_group";
  const std::string tail = R"(,"rank_offset":1,"world_size":2,"backend":"gloo"})";
  struct Case {
    std::string path;
    std::string body;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"/begin_weight_update", R"({"selector":NaN})", "body"},
      {"/begin_weight_update", R"({"selector":Infinity})", "body"},
      {"/begin_weight_update", R"({"selector":undefined})", "body"},
      {"/begin_weight_update", R"({'selector':'all'})", "body"},
      {"/begin_weight_update", R"({"selector":"all",})", "body"},
      {"/begin_weight_update", R"({"selector":"all"/*c*/})", "body"},
      {"/begin_weight_update", R"({"selector":"all"} {"selector":"draft"})", "body"},
      {"/begin_weight_update", R"({selector:"all"})", "body"},
      {init, R"({"master_address":"127.0.0.1","master_port":-Infinity)" + tail, "body"},
      {init, R"({"master_address":"127.0.0.1","master_port":1e400)" + tail, "overflow"},
      {init, R"({"master_address":"127.0.0.1","master_port":2.95e4)" + tail, "master_port"},
      {init, R"({"master_address":"127.0.0.1","master_port":0x7530)" + tail, "body"},
      {init, R"({"master_address":"127.0.0.1","master_port":+29500)" + tail, "body"},
      {init, R"({"master_address":"127.0.0.1","master_port":029500)" + tail, "body"},
      {init, R"({"master_address":"127.0.0.1","master_port":-0)" + tail, "master_port"},
      {init, R"({"master_address":"127.0.0.1","master_port":123456789012345678901234567890)" + tail,
       "master_port"},
      {"/update_weights_from_distributed",
       R"({"names":["model.a"],"dtypes":["bfloat16"],"shapes":[[1e3]],"selector":"target","sequence":0})",
       "shapes[0][0]"},
      {"/update_weights_from_distributed",
       R"({"names":["model.a"],"dtypes":["bfloat16"],"shapes":[[4]],"selector":"target","sequence":18446744073709551616})",
       "sequence"},
      {"/update_weight_version", R"({"new_version":7e400})", "overflow"},
      {"/pause_generation", R"({"mode":"abort","mode":"retract"})", "duplicate"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body);
    const HttpReply reply = engine.post(c.path, c.body);
    EXPECT_EQ(reply.status, 400) << reply.body;
    EXPECT_NE(reply.message().find(c.needle), std::string::npos) << reply.message();
    EXPECT_EQ(engine.state(), before);
  }
}

TEST(SecuritySchema, StoreValuesAreOpaqueBytes) {
  StoreProcess store({"--token", "st0re"});
  comm::TcpStoreOptions o;
  o.host = store.host;
  o.port = static_cast<std::uint16_t>(store.port);
  o.token = "st0re";
  o.connect_timeout = 5s;
  comm::TcpStore client(o);
  // A pickle that would call os.system, a JSON prototype gadget, NULs and invalid UTF-8: the
  // store neither interprets nor normalizes any of them.
  static const char kPickle[] =
      "\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94"
      "\x8c\x02id\x94\x85\x94R\x94.";
  const std::vector<std::string> values = {
      std::string(kPickle, sizeof(kPickle) - 1), R"({"__proto__":{"admin":true}})",
      std::string("\0\xff\xfe\0", 4), std::string(), std::string(4096, '\xc0')};
  for (std::size_t i = 0; i < values.size(); ++i) {
    client.set("v/" + std::to_string(i), values[i], 2s);
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(client.get("v/" + std::to_string(i), 2s), values[i]) << i;
  }
}

}  // namespace
}  // namespace weightcast::security
