#include "launcher/bench/requests.h"

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "sync/protocol/bucket_request.h"
#include "sync/protocol/protocol.h"

namespace weightcast::launcher {
namespace {

using Json = nlohmann::json;

// A SAX handler that accepts everything and keeps nothing: the lexer's own cost.
struct NullSax : Json::json_sax_t {
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

// Experts of a Qwen3-MoE-style layer, three matrices each, in the order a trainer sends them.
sync::UpdateWeightsFromDistributedRequest expert_bucket(int tensors) {
  sync::UpdateWeightsFromDistributedRequest r;
  r.selector = sync::Selector::kTarget;
  r.sequence = 3;
  r.session_id = "s-00000000000000000000000000000001";
  const char* matrices[] = {"gate_proj", "up_proj", "down_proj"};
  for (int i = 0; i < tensors; ++i) {
    sync::TensorMeta t;
    t.name = "model.layers." + std::to_string(i / 192) + ".mlp.experts." +
             std::to_string(i / 3 % 64) + "." + matrices[i % 3] + ".weight";
    t.dtype = sync::DType::kBFloat16;
    t.shape =
        i % 3 == 2 ? std::vector<std::int64_t>{1024, 256} : std::vector<std::int64_t>{256, 1024};
    r.tensors.push_back(std::move(t));
    char digest[33];
    std::snprintf(digest, sizeof(digest), "%032x", i * 2654435761u);
    r.digests.emplace_back(digest);
  }
  return r;
}

// Mean microseconds of `op` over `iters` calls, after one warm-up call.
double mean_us(int iters, const std::function<std::size_t()>& op) {
  std::size_t sink = op();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) sink += op();
  const std::chrono::duration<double, std::micro> spent = std::chrono::steady_clock::now() - start;
  if (sink == 0) std::fprintf(stderr, "(nothing measured)\n");
  return spent.count() / iters;
}

}  // namespace

int run_requests_bench(const RequestsBenchOptions& options) {
  const auto request = expert_bucket(options.tensors);
  const std::string body = sync::to_json_string(request);
  const sync::ProtocolLimits limits;
  if (!(sync::parse_update_weights_from_distributed(body, limits) == request)) {
    std::fprintf(stderr,
                 "weightcast-bench requests: the body does not parse back to the request\n");
    return 1;
  }
  const int n = options.iters;
  const double floor = mean_us(n, [&] {
    NullSax sax;
    return static_cast<std::size_t>(Json::sax_parse(body, &sax));
  });
  const double dom = mean_us(n, [&] { return Json::parse(body).size(); });
  const double parse = mean_us(
      n, [&] { return sync::parse_update_weights_from_distributed(body, limits).tensors.size(); });
  // The engine's DOM reader alone: what it parsed with before the SAX pass, and still does for
  // any body that pass hands over.
  const double parse_dom =
      mean_us(n, [&] { return sync::read_bucket_request_dom(body, limits).tensors.size(); });
  const double build = mean_us(n, [&] { return sync::to_json_string(request).size(); });
  std::printf(
      "# weightcast-bench requests: a bucket request of %d expert tensors with digests, "
      "%zu bytes of JSON, %d iterations each, one core\n",
      options.tensors, body.size(), n);
  std::printf("%-44s %12s %12s %12s\n", "operation", "us/request", "us/tensor", "vs lexer");
  const auto row = [&](const char* what, double us) {
    std::printf("%-44s %12.1f %12.3f %11.2fx\n", what, us, us / options.tensors, us / floor);
  };
  row("nlohmann SAX lexer, null handler (floor)", floor);
  row("nlohmann DOM parse (Json::parse)", dom);
  row("engine: parse_update_weights_from_distributed", parse);
  row("engine: its DOM reader alone (the error path)", parse_dom);
  row("trainer: to_json_string", build);
  return 0;
}

}  // namespace weightcast::launcher
