// The route methods of sync::trainer::EngineApi (all but url() and flavor()), declared as
// overrides, for the test doubles that implement every route (FakeEngine in
// tests/sync/trainer/fakes.h, FaultyEngine in tests/faults/faulty_engine.h): one list, so a
// route added to EngineApi is declared for all of them here. Use it inside the class body, in a
// public section; the class defines each method in its own source file.
#pragma once

#include <string>

#include "sync/trainer/engine_api.h"

#define WEIGHTCAST_ENGINE_API_ROUTE_OVERRIDES                                                     \
  ::weightcast::sync::BasicResponse health() override;                                            \
  ::weightcast::sync::ServerInfoResponse server_info() override;                                  \
  ::weightcast::sync::BasicResponse init_weights_update_group(                                    \
      const ::weightcast::sync::InitWeightsUpdateGroupRequest& req) override;                     \
  ::weightcast::sync::BasicResponse destroy_weights_update_group(                                 \
      const ::weightcast::sync::DestroyWeightsUpdateGroupRequest& req) override;                  \
  ::weightcast::sync::BasicResponse pause_generation(                                             \
      const ::weightcast::sync::PauseGenerationRequest& req) override;                            \
  ::weightcast::sync::BasicResponse flush_cache() override;                                       \
  ::weightcast::sync::BeginWeightUpdateResponse begin_weight_update(                              \
      const ::weightcast::sync::BeginWeightUpdateRequest& req) override;                          \
  ::weightcast::sync::BasicResponse update_weights_from_distributed(                              \
      const ::weightcast::sync::UpdateWeightsFromDistributedRequest& req) override;               \
  ::weightcast::sync::BasicResponse update_weight_version(                                        \
      const ::weightcast::sync::UpdateWeightVersionRequest& req) override;                        \
  ::weightcast::sync::EndWeightUpdateResponse end_weight_update(                                  \
      const ::weightcast::sync::EndWeightUpdateRequest& req) override;                            \
  ::weightcast::sync::BasicResponse continue_generation(                                          \
      const ::weightcast::sync::ContinueGenerationRequest& req) override;                         \
  ::weightcast::sync::BasicResponse abort_weight_update(                                          \
      const ::weightcast::sync::AbortWeightUpdateRequest& req) override;                          \
  ::weightcast::sync::WeightsChecksumResponse weights_checksum(::weightcast::sync::Runner runner, \
                                                               bool recompute = false) override;  \
  std::string metrics() override;                                                                 \
  ::weightcast::sync::SpecAcceptLengthResponse spec_accept_length() override
