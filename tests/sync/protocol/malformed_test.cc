// A table of malformed request bodies per route. Each case edits a valid body and must be
// rejected with comm::BadRequestError whose message starts with the path of the field at fault.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync {
namespace {

using Json = nlohmann::json;

struct Route {
  Json valid;
  std::function<void(std::string_view)> parse;
};

const std::map<std::string, Route>& routes() {
  static const std::map<std::string, Route> kRoutes = {
      {"init_weights_update_group",
       {Json::parse(R"({"master_address":"10.0.0.1","master_port":29500,"rank_offset":1,
                        "world_size":3,"group_name":"wc-pp_0","backend":"gloo"})"),
        [](std::string_view b) { parse_init_weights_update_group(b); }}},
      {"destroy_weights_update_group",
       {Json::parse(R"({"group_name":"wc-pp_0"})"),
        [](std::string_view b) { parse_destroy_weights_update_group(b); }}},
      {"pause_generation",
       {Json::parse(R"({"mode":"retract"})"),
        [](std::string_view b) { parse_pause_generation(b); }}},
      {"continue_generation",
       {Json::parse(R"({"torch_empty_cache":false})"),
        [](std::string_view b) { parse_continue_generation(b); }}},
      {"begin_weight_update",
       {Json::parse(R"({"selector":"target"})"),
        [](std::string_view b) { parse_begin_weight_update(b); }}},
      {"update_weights_from_distributed",
       {Json::parse(R"({"names":["a.weight","b.bias"],"dtypes":["bfloat16","float32"],
                        "shapes":[[4,8],[8]],"group_name":"wc-pp_0","selector":"target",
                        "sequence":0,"load_format":"flattened_bucket","flush_cache":true,
                        "abort_all_requests":false,"weight_version":"step-3",
                        "torch_empty_cache":false})"),
        [](std::string_view b) { parse_update_weights_from_distributed(b); }}},
      {"update_weight_version",
       {Json::parse(R"({"new_version":"step-3","abort_all_requests":false})"),
        [](std::string_view b) { parse_update_weight_version(b); }}},
  };
  return kRoutes;
}

struct Case {
  std::string route;
  std::string pointer;        // JSON pointer of the field to replace or remove
  std::optional<Json> value;  // nullopt: remove the field
  std::string expected;       // the message must start with this
};

Json deep_shape(std::size_t rank) {
  return Json(std::vector<int>(rank, 1));
}

std::vector<Case> cases() {
  const std::string init = "init_weights_update_group";
  const std::string bucket = "update_weights_from_distributed";
  return {
      {init, "/master_address", std::nullopt, "master_address: missing required field"},
      {init, "/master_address", 5, "master_address: must be a string (got integer)"},
      {init, "/master_address", "", "master_address: must not be empty"},
      {init, "/master_address", "a b", "master_address: "},
      {init, "/master_address", std::string(256, 'h'), "master_address: 256 bytes"},
      {init, "/master_port", 0, "master_port: must be in [1, 65535] (got 0)"},
      {init, "/master_port", 65536, "master_port: must be in [1, 65535] (got 65536)"},
      {init, "/master_port", -1, "master_port: must be in [1, 65535] (got -1)"},
      {init, "/master_port", "29500", "master_port: must be an integer"},
      {init, "/master_port", 29500.0, "master_port: must be an integer"},
      {init, "/master_port", true, "master_port: must be an integer"},
      {init, "/master_port", std::nullopt, "master_port: missing required field"},
      {init, "/world_size", 0, "world_size: must be in [1, "},
      {init, "/world_size", std::int64_t{1} << 40, "world_size: must be in [1, "},
      {init, "/world_size", std::nullopt, "world_size: missing required field"},
      {init, "/rank_offset", 0, "rank_offset: must be in [1, "},
      {init, "/rank_offset", 3, "rank_offset: must be in [1, world_size) = [1, 3) (got 3)"},
      {init, "/rank_offset", std::nullopt, "rank_offset: missing required field"},
      {init, "/group_name", "", "group_name: must not be empty"},
      {init, "/group_name", nullptr, "group_name: must be a string (got null)"},
      {init, "/backend", "mpi", "backend: unknown backend 'mpi' (valid: nccl, gloo)"},
      {init, "/backend", nullptr, "backend: must be a string"},
      {init, "/ranks", 1, "ranks: must be a non-empty list of engine ranks"},
      {init, "/ranks", Json::array(), "ranks: must be a non-empty list of engine ranks"},
      {init, "/ranks", Json::array({-1}), "ranks[0]: must be in [0, "},
      {init, "/ranks", Json::array({2, 1}), "ranks[1]: must be above the rank before it"},
      {init, "/ranks", Json::array({0, 1, 2}), "ranks: 3 ranks from rank_offset 1 exceed world"},

      {"destroy_weights_update_group", "/group_name", 7, "group_name: must be a string"},
      {"destroy_weights_update_group", "/group_name", "x\ny", "group_name: "},
      {"pause_generation", "/mode", "pause", "mode: unknown pause mode 'pause'"},
      {"pause_generation", "/mode", 1, "mode: must be a string"},
      {"continue_generation", "/torch_empty_cache", "yes",
       "torch_empty_cache: must be a boolean (got string)"},
      {"continue_generation", "/torch_empty_cache", 1, "torch_empty_cache: must be a boolean"},
      {"begin_weight_update", "/selector", std::nullopt, "selector: missing required field"},
      {"begin_weight_update", "/selector", "both", "selector: unknown selector 'both'"},
      {"begin_weight_update", "/selector", nullptr, "selector: must be a string (got null)"},
      {"begin_weight_update", "/selector", Json::array({"all"}), "selector: must be a string"},

      {bucket, "/names", std::nullopt, "names: missing required field"},
      {bucket, "/names", "a.weight", "names: must be an array (got string)"},
      {bucket, "/dtypes", Json::array({"bfloat16"}), "dtypes: 1 entries, but names has 2"},
      {bucket, "/shapes", Json::parse("[[1],[2],[3]]"), "shapes: 3 entries, but names has 2"},
      {bucket, "/names/1", 5, "names[1]: must be a string (got integer)"},
      {bucket, "/names/1", "a.weight", "names[1]: duplicate of names[0] ('a.weight')"},
      {bucket, "/names/1", "", "names[1]: must not be empty"},
      {bucket, "/names/1", "bad name", "names[1]: 'bad name' has byte 3"},
      {bucket, "/dtypes/1", "float4", "dtypes[1]: unknown dtype 'float4'"},
      {bucket, "/dtypes/0", nullptr, "dtypes[0]: must be a string (got null)"},
      {bucket, "/shapes/1", 8, "shapes[1]: must be an array (got integer)"},
      {bucket, "/shapes/1", Json::parse("[8,-1]"), "shapes[1][1]: must be >= 0 (got -1)"},
      {bucket, "/shapes/0", Json::parse("[4,\"8\"]"), "shapes[0][1]: must be an integer"},
      {bucket, "/shapes/0", Json::parse("[4,8.5]"), "shapes[0][1]: must be an integer"},
      {bucket, "/shapes/0", Json::parse("[1e20]"), "shapes[0][0]: must be an integer"},
      {bucket, "/shapes/0", Json::parse("[18446744073709551615]"), "shapes[0][0]: must be in"},
      {bucket, "/shapes/0", Json::parse("[1099511627776,1099511627776]"),
       "shapes[0]: element count overflows int64"},
      {bucket, "/shapes/0", Json::parse("[4611686018427387904]"), "shapes[0]: byte count"},
      {bucket, "/shapes/0", deep_shape(65), "shapes[0]: 65 entries, more than the limit of 64"},
      {bucket, "/selector", "everything", "selector: unknown selector 'everything'"},
      {bucket, "/sequence", -1, "sequence: must be in [0, "},
      {bucket, "/sequence", "1", "sequence: must be an integer"},
      {bucket, "/load_format", "direct", "load_format: unknown load format 'direct'"},
      {bucket, "/load_format", 3, "load_format: must be a string"},
      {bucket, "/flush_cache", "true", "flush_cache: must be a boolean"},
      {bucket, "/abort_all_requests", nullptr, "abort_all_requests: must be a boolean"},
      {bucket, "/torch_empty_cache", 0, "torch_empty_cache: must be a boolean"},
      {bucket, "/weight_version", 3, "weight_version: must be a string"},
      {bucket, "/weight_version", "", "weight_version: must not be empty"},
      {bucket, "/weight_version", "v\x01", "weight_version: 'v\\x01' contains a control"},
      {bucket, "/group_name", "", "group_name: must not be empty"},

      {"update_weight_version", "/new_version", std::nullopt,
       "new_version: missing required field"},
      {"update_weight_version", "/new_version", 12, "new_version: must be a string"},
      {"update_weight_version", "/new_version", std::string(257, 'v'), "new_version: 257 bytes"},
      {"update_weight_version", "/abort_all_requests", "no",
       "abort_all_requests: must be a boolean"},
  };
}

TEST(ProtocolMalformed, ValidBodiesParse) {
  for (const auto& [name, route] : routes()) {
    EXPECT_NO_THROW(route.parse(route.valid.dump())) << name;
  }
}

TEST(ProtocolMalformed, EveryCaseNamesItsField) {
  std::set<std::string> covered;
  for (const Case& c : cases()) {
    const Route& route = routes().at(c.route);
    Json body = route.valid;
    const Json::json_pointer ptr(c.pointer);
    if (c.value) {
      body[ptr] = *c.value;
    } else {
      body[ptr.parent_pointer()].erase(ptr.back());
    }
    try {
      route.parse(body.dump());
      ADD_FAILURE() << c.route << " accepted " << body.dump();
    } catch (const comm::BadRequestError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(c.expected, 0), 0u)
          << c.route << " " << c.pointer << ": got \"" << e.what() << "\", want prefix \""
          << c.expected << "\"";
    }
    covered.insert(c.route);
  }
  EXPECT_EQ(covered.size(), routes().size());
}

// SGLang's own bucket body (what slime sends) has no selector and no sequence: both optional
// (a sessionless update, docs/protocol.md), a selector given is still checked.
TEST(ProtocolMalformed, PlainSGLangBucketParsesWithoutSelector) {
  const std::string body =
      R"({"names":["w"],"dtypes":["bfloat16"],"shapes":[[2]],"group_name":"g","flush_cache":false})";
  const auto request = parse_update_weights_from_distributed(body);
  EXPECT_FALSE(request.selector.has_value());
  EXPECT_FALSE(request.sequence.has_value());
  EXPECT_EQ(request.load_format, LoadFormat::kPerTensor);
  EXPECT_TRUE(parse_update_weights_from_distributed(to_json_string(request)) == request);
}

}  // namespace
}  // namespace weightcast::sync
