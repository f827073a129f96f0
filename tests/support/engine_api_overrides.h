// The route methods of sync::trainer::EngineApi (all but url() and flavor()), declared as
// overrides, for the test doubles that implement every route (FakeEngine in
// tests/sync/trainer/fakes.h, FaultyEngine in tests/faults/faulty_engine.h): one list, so a
// route added to EngineApi is declared for all of them here. Use it inside the class body, in a
// public section; the class defines each method in its own source file.
#pragma once

#include <string>

#include "sync/trainer/engine_api.h"

// A route that takes a request body: `Response route(const Request& req) override`, the types
// named in ::weightcast::sync (the test doubles live in other namespaces).
#define WEIGHTCAST_ENGINE_API_BODY_ROUTE(Response, route, Request) \
  ::weightcast::sync::Response route(const ::weightcast::sync::Request& req) override

#define WEIGHTCAST_ENGINE_API_ROUTE_OVERRIDES                                                      \
  ::weightcast::sync::BasicResponse health() override;                                             \
  ::weightcast::sync::ServerInfoResponse server_info() override;                                   \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, init_weights_update_group,                       \
                                   InitWeightsUpdateGroupRequest);                                 \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, destroy_weights_update_group,                    \
                                   DestroyWeightsUpdateGroupRequest);                              \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, pause_generation, PauseGenerationRequest);       \
  ::weightcast::sync::BasicResponse flush_cache() override;                                        \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BeginWeightUpdateResponse, begin_weight_update,                 \
                                   BeginWeightUpdateRequest);                                      \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, update_weights_from_distributed,                 \
                                   UpdateWeightsFromDistributedRequest);                           \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, update_weight_version,                           \
                                   UpdateWeightVersionRequest);                                    \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(EndWeightUpdateResponse, end_weight_update,                     \
                                   EndWeightUpdateRequest);                                        \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, continue_generation, ContinueGenerationRequest); \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, abort_weight_update, AbortWeightUpdateRequest);  \
  WEIGHTCAST_ENGINE_API_BODY_ROUTE(BasicResponse, release_lease, ReleaseLeaseRequest);             \
  ::weightcast::sync::BasicResponse update_weights_from_disk(const std::string& model_path)        \
      override;                                                                                    \
  ::weightcast::sync::WeightsChecksumResponse weights_checksum(::weightcast::sync::Runner runner,  \
                                                               bool recompute = false) override;   \
  std::string metrics() override;                                                                  \
  ::weightcast::sync::SpecAcceptLengthResponse spec_accept_length() override
