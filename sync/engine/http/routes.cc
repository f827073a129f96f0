#include "sync/engine/http/routes.h"

#include <algorithm>

#include "comm/errors.h"
#include "sync/engine/engine.h"

namespace weightcast::sync::engine {

std::string_view to_string(Method method) {
  return method == Method::kGet ? "GET" : "POST";
}

void RouteTable::add(Route route) {
  WC_ENFORCE(!route.path.empty() && route.path.front() == '/', "route path '", route.path,
             "' must start with '/'");
  WC_ENFORCE(find(route.path) == nullptr, "route '", route.path, "' added twice");
  WC_ENFORCE(!route.methods.empty(), "route '", route.path, "' has no methods");
  WC_ENFORCE(route.auth == Auth::kPublic || route.auth == Auth::kToken, "route '", route.path,
             "' has no auth level (", static_cast<int>(route.auth), ")");
  for (Method m : route.methods) {
    WC_ENFORCE(m == Method::kGet || m == Method::kPost, "route '", route.path,
               "' has an unknown method (", static_cast<int>(m), ")");
  }
  WC_ENFORCE(static_cast<bool>(route.handler), "route '", route.path, "' has no handler");
  routes_.push_back(std::move(route));
}

const Route* RouteTable::find(std::string_view path) const {
  auto it =
      std::find_if(routes_.begin(), routes_.end(), [&](const Route& r) { return r.path == path; });
  return it == routes_.end() ? nullptr : &*it;
}

namespace {

// Parses the body with the protocol's strict reader and calls the engine; malformed input is a
// 400 naming the field, before the engine sees anything.
template <typename Parse, typename Call>
Handler parsed(const ProtocolLimits& limits, Parse parse, Call call) {
  return [limits, parse, call](const Request& request) -> Reply {
    try {
      auto body = parse(request.body, limits);
      return call(body);
    } catch (const comm::BadRequestError& e) {
      return error_reply(400, e.what());
    }
  };
}

}  // namespace

namespace {

const std::vector<Method> kPost{Method::kPost};
const std::vector<Method> kGet{Method::kGet};

// The routes that change the engine: groups, generation, the update session.
void add_update_routes(RouteTable& table, Engine* e, const ProtocolLimits& limits) {
  table.add({"/init_weights_update_group", kPost, Auth::kToken,
             parsed(limits, parse_init_weights_update_group,
                    [e](const auto& r) { return e->init_weights_update_group(r); })});
  table.add({"/destroy_weights_update_group", kPost, Auth::kToken,
             parsed(limits, parse_destroy_weights_update_group,
                    [e](const auto& r) { return e->destroy_weights_update_group(r); })});
  table.add({"/pause_generation", kPost, Auth::kToken,
             parsed(limits, parse_pause_generation,
                    [e](const auto& r) { return e->pause_generation(r); })});
  table.add({"/continue_generation", kPost, Auth::kToken,
             parsed(limits, parse_continue_generation,
                    [e](const auto& r) { return e->continue_generation(r); })});
  table.add({"/flush_cache",
             {Method::kGet, Method::kPost},
             Auth::kToken,
             parsed(limits, parse_flush_cache, [e](const auto&) { return e->flush_cache(); })});
  table.add({"/begin_weight_update", kPost, Auth::kToken,
             parsed(limits, parse_begin_weight_update,
                    [e](const auto& r) { return e->begin_weight_update(r); })});
  table.add({"/update_weights_from_distributed", kPost, Auth::kToken,
             parsed(limits, parse_update_weights_from_distributed,
                    [e](const auto& r) { return e->update_weights_from_distributed(r); })});
  table.add({"/update_weight_version", kPost, Auth::kToken,
             parsed(limits, parse_update_weight_version,
                    [e](const auto& r) { return e->update_weight_version(r); })});
  table.add({"/end_weight_update", kPost, Auth::kToken,
             parsed(limits, parse_end_weight_update,
                    [e](const auto& r) { return e->end_weight_update(r); })});
  // Ours: the trainer's abort path. Like end, it takes no fields.
  table.add({"/abort_weight_update", kPost, Auth::kToken,
             parsed(limits, parse_abort_weight_update,
                    [e](const auto& r) { return e->abort_weight_update(r); })});
}

// GET /weights_checksum?runner=NAME[&recompute=1]
Reply weights_checksum_route(Engine* e, const Request& request) {
  auto it = request.query.find("runner");
  if (it == request.query.end()) {
    return error_reply(400, "runner: missing required query parameter");
  }
  bool recompute = false;
  if (auto r = request.query.find("recompute"); r != request.query.end()) {
    if (r->second == "1" || r->second == "true") {
      recompute = true;
    } else if (r->second != "0" && r->second != "false") {
      return error_reply(400, "recompute: must be 0, 1, false or true");
    }
  }
  return e->weights_checksum(it->second, recompute);
}

// The routes that only read.
void add_read_routes(RouteTable& table, Engine* e) {
  table.add({"/health", kGet, Auth::kPublic, [e](const Request&) { return e->health(); }});
  // SGLang's names for what Miles and SGLang clients poll; token-checked like every read but
  // /health (with no token configured every route is open, as in SGLang without an API key).
  table.add({"/health_generate", kGet, Auth::kToken, [e](const Request&) { return e->health(); }});
  table.add({"/get_weight_version", kGet, Auth::kToken,
             [e](const Request&) { return e->weight_version_info(); }});
  table.add({"/model_info", kGet, Auth::kToken, [e](const Request&) { return e->model_info(); }});
  table.add(
      {"/get_model_info", kGet, Auth::kToken, [e](const Request&) { return e->model_info(); }});
  table.add({"/server_info", kGet, Auth::kToken, [e](const Request&) { return e->server_info(); }});
  // SGLang serves the same document under both names.
  table.add(
      {"/get_server_info", kGet, Auth::kToken, [e](const Request&) { return e->server_info(); }});
  table.add({"/weights_checksum", kGet, Auth::kToken,
             [e](const Request& request) { return weights_checksum_route(e, request); }});
  table.add({"/spec_accept_length", kGet, Auth::kToken,
             [e](const Request&) { return e->spec_accept_length(); }});
  table.add({"/metrics", kGet, Auth::kPublic, [e](const Request&) { return e->metrics(); }});
}

}  // namespace

RouteTable engine_routes(Engine& engine) {
  RouteTable table;
  add_update_routes(table, &engine, engine.options().limits);
  add_read_routes(table, &engine);
  return table;
}

}  // namespace weightcast::sync::engine
