// The two readers behind parse_update_weights_from_distributed() (sync/protocol/protocol.h), for
// tests that hold them side by side; other callers use that function.
// Threading: pure functions.
#pragma once

#include <optional>
#include <string_view>

#include "sync/protocol/protocol.h"
#include "sync/protocol/protocol_limits.h"

namespace weightcast::sync {

// One SAX pass: the tensor lists straight into the request, the other fields through a small
// DOM. nullopt for any body it does not take whole, valid or not; it never throws a protocol
// error (the DOM reader reports them).
std::optional<UpdateWeightsFromDistributedRequest> read_bucket_request_fast(
    std::string_view body, const ProtocolLimits& limits);

// The whole body as a DOM, every field checked with its path in the error
// (comm::BadRequestError "names[3]: ...").
UpdateWeightsFromDistributedRequest read_bucket_request_dom(std::string_view body,
                                                            const ProtocolLimits& limits);

}  // namespace weightcast::sync
