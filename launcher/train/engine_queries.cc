#include "launcher/train/engine_queries.h"

#include <cstdio>
#include <memory>
#include <vector>

#include "comm/errors.h"
#include "sync/trainer/engine_calls.h"
#include "sync/trainer/http/engine_client.h"

namespace weightcast::launcher::train {

using namespace sync::trainer;

std::optional<std::string> engines_speculative_algorithm(const TrainOptions& o) {
  EngineClientOptions co;
  co.token = o.token;
  co.connect_timeout = comm::Millis(o.connect_timeout_ms);
  co.request_timeout = comm::Millis(o.request_timeout_ms);
  co.keep_alive = !o.no_keep_alive;
  std::vector<std::unique_ptr<EngineApi>> clients;
  std::vector<EngineApi*> engines;
  for (const auto& url : o.engines) {
    engines.push_back(clients.emplace_back(std::make_unique<EngineClient>(url, co)).get());
  }
  std::vector<sync::ServerInfoResponse> infos(engines.size());
  throw_if_failed("reading /server_info", on_all_engines(engines, "GET /server_info",
                                                         [&infos](EngineApi& e, std::size_t i) {
                                                           infos[i] = e.server_info();
                                                         }));
  for (std::size_t i = 1; i < infos.size(); ++i) {
    if (infos[i].speculative_algorithm != infos[0].speculative_algorithm) {
      throw comm::ConfigError("engines disagree on speculative_algorithm (" + engines[0]->url() +
                              " vs. " + engines[i]->url() + "); pass --speculative-algorithm");
    }
  }
  return infos[0].speculative_algorithm;
}

std::string accept_lengths(std::span<EngineApi* const> engines) {
  std::string out = " accept_length ";
  for (std::size_t i = 0; i < engines.size(); ++i) {
    char value[32] = "n/a";
    try {
      std::snprintf(value, sizeof(value), "%.2f", engines[i]->spec_accept_length().accept_length);
    } catch (const comm::Error& e) {
      std::fprintf(stderr, "weightcast-train: accept-length probe: %s\n", e.what());
    }
    out += (i ? "," : "") + std::string(value);
  }
  return out;
}

}  // namespace weightcast::launcher::train
