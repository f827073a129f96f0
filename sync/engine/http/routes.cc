#include "sync/engine/http/routes.h"

#include <algorithm>

#include "comm/errors.h"
#include "sync/engine/control/engine.h"

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

const std::vector<Method> kPost{Method::kPost};
const std::vector<Method> kGet{Method::kGet};

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

// A token-checked POST route: `parse` reads the body, then the engine's `call` (a method of one
// of its parts) takes it.
template <typename Body, typename Part>
Route post_route(std::string path, Engine* e, const ProtocolLimits& limits,
                 Body (*parse)(std::string_view, const ProtocolLimits&),
                 Reply (Part::*call)(const Body&)) {
  Part* part = e;
  return {std::move(path), kPost, Auth::kToken,
          parsed(limits, parse, [part, call](const Body& body) { return (part->*call)(body); })};
}

// The routes that change the engine: groups, generation, the update session.
void add_update_routes(RouteTable& table, Engine* e, const ProtocolLimits& limits) {
  const auto post = [&](std::string path, auto parse, auto call) {
    table.add(post_route(std::move(path), e, limits, parse, call));
  };
  post("/init_weights_update_group", parse_init_weights_update_group,
       &Engine::init_weights_update_group);
  post("/destroy_weights_update_group", parse_destroy_weights_update_group,
       &Engine::destroy_weights_update_group);
  post("/pause_generation", parse_pause_generation, &Engine::pause_generation);
  post("/continue_generation", parse_continue_generation, &Engine::continue_generation);
  // GET as Miles sends it to SGLang, POST as our trainer does; no fields either way.
  table.add({"/flush_cache",
             {Method::kGet, Method::kPost},
             Auth::kToken,
             parsed(limits, parse_flush_cache, [e](const auto&) { return e->flush_cache(); })});
  post("/begin_weight_update", parse_begin_weight_update, &Engine::begin_weight_update);
  post("/update_weights_from_distributed", parse_update_weights_from_distributed,
       &Engine::update_weights_from_distributed);
  post("/update_weight_version", parse_update_weight_version, &Engine::update_weight_version);
  post("/end_weight_update", parse_end_weight_update, &Engine::end_weight_update);
  // Ours: the trainer's abort path. Like end, it takes no fields.
  post("/abort_weight_update", parse_abort_weight_update, &Engine::abort_weight_update);
  // SGLang's route and body: drops an adapter (requests that took it keep it; docs/lora.md).
  post("/unload_lora_adapter", parse_unload_lora_adapter, &Engine::unload_lora_adapter);
  // Ours: ends the trainer's lease (with its id), or breaks it (force, an operator's call).
  post("/release_weight_update_lease", parse_release_lease, &Engine::release_lease);
  // SGLang's: checksum / snapshot / compare of the resident weights.
  post("/weights_checker", parse_weights_checker, &Engine::weights_checker);
  // The colocated path: weightcast's segment manifest (SGLang's pickled form gets a 400).
  post("/update_weights_from_tensor", parse_update_weights_from_tensor,
       &Engine::update_weights_from_tensor);
}

// GET /weights_checksum?runner=NAME[&recompute=1] or ?lora=NAME
Reply weights_checksum_route(const Engine* e, const Request& request) {
  if (auto lora = request.query.find("lora"); lora != request.query.end()) {
    return e->lora_checksum(lora->second);
  }
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

// A GET route answered by the engine's `call` alone.
Route read_route(std::string path, Auth auth, const Engine* e, Reply (Engine::*call)() const) {
  return {std::move(path), kGet, auth, [e, call](const Request&) { return (e->*call)(); }};
}

// The routes that only read.
void add_read_routes(RouteTable& table, const Engine* e) {
  table.add(read_route("/health", Auth::kPublic, e, &Engine::health));
  // SGLang's names for what Miles and SGLang clients poll; token-checked like every read but
  // /health (with no token configured every route is open, as in SGLang without an API key).
  table.add(read_route("/health_generate", Auth::kToken, e, &Engine::health));
  table.add(read_route("/get_weight_version", Auth::kToken, e, &Engine::weight_version_info));
  table.add(read_route("/model_info", Auth::kToken, e, &Engine::model_info));
  table.add(read_route("/get_model_info", Auth::kToken, e, &Engine::model_info));
  table.add(read_route("/server_info", Auth::kToken, e, &Engine::server_info));
  // SGLang serves the same document under both names.
  table.add(read_route("/get_server_info", Auth::kToken, e, &Engine::server_info));
  table.add({"/weights_checksum", kGet, Auth::kToken,
             [e](const Request& request) { return weights_checksum_route(e, request); }});
  table.add(read_route("/spec_accept_length", Auth::kToken, e, &Engine::spec_accept_length));
  table.add(read_route("/metrics", Auth::kPublic, e, &Engine::metrics));
}

}  // namespace

RouteTable engine_routes(Engine& engine) {
  RouteTable table;
  add_update_routes(table, &engine, engine.options().limits);
  add_read_routes(table, &engine);
  return table;
}

}  // namespace weightcast::sync::engine
