// No allocation proportional to a claimed size: every route's handler (parse + engine logic, as
// the HTTP server calls it) gets bodies that claim terabytes, billions of elements or of ranks,
// and the largest single allocation the process makes meanwhile stays proportional to the body
// itself. alloc_probe.cc replaces operator new for this binary to record that maximum.
#include <gtest/gtest.h>

#include <algorithm>

#include "comm/errors.h"
#include "sync/engine/http/routes.h"
#include "tests/comm/store/alloc_probe.h"
#include "tests/security/inprocess_engine.h"

namespace weightcast::security {
namespace {

using sync::engine::Method;
using Json = nlohmann::json;

struct Claim {
  std::string path;
  std::string body;
  int status;
};

std::string bucket(const std::vector<Json>& shapes, const std::string& dtype = "bfloat16") {
  Json b = {{"group_name", "g"}, {"selector", "target"}, {"sequence", 0}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    b["names"].push_back("model.t" + std::to_string(i));
    b["dtypes"].push_back(dtype);
    b["shapes"].push_back(shapes[i]);
  }
  return b.dump();
}

std::vector<Claim> claims() {
  const std::string init = "/init_weights_update_group";
  const std::string upd = "/update_weights_from_distributed";
  std::vector<Json> gib(1024, Json::array({std::int64_t{1} << 30}));
  return {
      {upd, bucket({Json::array({std::int64_t{1} << 39})}), 400},                // 1 TiB
      {upd, bucket(gib, "uint8"), 400},                                          // 1024 x 1 GiB
      {upd, bucket({Json(std::vector<std::int64_t>(64, 1 << 20))}), 400},        // overflows
      {upd, bucket({Json::array({std::int64_t{1} << 62, 4})}, "float64"), 400},  // overflows
      {upd, bucket({Json::array({std::int64_t{3} << 30})}, "float32"), 400},     // 12 GiB > max
      {init,
       R"({"master_address":"127.0.0.1","master_port":1,"rank_offset":2147483646,"world_size":2147483647,"backend":"gloo"})",
       400},  // the join's timeout, in SGLang's dialect (no rendezvous named)
      {"/update_weight_version", R"({"new_version":")" + std::string(1 << 16, 'v') + "\"}", 400},
      {"/begin_weight_update", R"({"selector":")" + std::string(1 << 16, 's') + "\"}", 400},
      {"/pause_generation", "{\"x\":" + std::string(1 << 16, '[') + "}", 400},
  };
}

TEST(SecurityAlloc, HugeClaimsAllocateInProportionToTheBodyNotTheClaim) {
  sync::engine::EngineOptions opts;
  opts.max_bucket_bytes = std::size_t{4} << 30;
  opts.limits.max_bucket_bytes = opts.max_bucket_bytes;
  opts.connector = [](const sync::engine::GroupSpec&, const sync::engine::ConnectOptions&)
      -> std::vector<std::unique_ptr<sync::engine::BucketChannel>> {
    throw comm::TimeoutError("test connector: no trainer");
  };
  auto engine = make_inprocess_engine(opts);
  const auto table = sync::engine::engine_routes(*engine);
  ASSERT_EQ(table.find("/begin_weight_update")
                ->handler({Method::kPost, "/begin_weight_update", R"({"selector":"target"})", {}})
                .status,
            200);
  std::size_t worst = 0;
  for (const Claim& c : claims()) {
    SCOPED_TRACE(c.path + " " + c.body.substr(0, 120));
    const auto* route = table.find(c.path);
    ASSERT_NE(route, nullptr);
    sync::engine::Request request{Method::kPost, c.path, c.body, {}};
    testing::reset_largest_allocation();
    const auto reply = route->handler(request);
    const std::size_t largest = testing::largest_allocation();
    EXPECT_EQ(reply.status, c.status) << reply.body.substr(0, 300);
    // The parser keeps the body and a JSON tree of it; a few times the body, never the claim.
    EXPECT_LT(largest, std::max<std::size_t>(8 * c.body.size(), 256 << 10));
    worst = std::max(worst, largest);
  }
  std::printf("[figure] largest single allocation while refusing huge claims: %zu bytes\n", worst);
}

}  // namespace
}  // namespace weightcast::security
