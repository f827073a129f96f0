// Field readers shared by the request parsers (protocol.cc, bucket_request.cc); not meant for
// other callers, who use the parse_* functions of sync/protocol/protocol.h.
// Threading: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "sync/protocol/protocol_json.h"
#include "sync/protocol/protocol_limits.h"
#include "sync/protocol/selector.h"

namespace weightcast::sync::wire {

// group_name is optional everywhere, defaulting to SGLang's name, and not Optional[str] there:
// null is a wrong type, not "absent".
std::string read_group_name(const FieldReader& r, const ProtocolLimits& limits);

// The required "selector".
Selector read_selector(const FieldReader& r);

// session_id and holder: optional text (null reads as absent), bounded like other strings.
std::optional<std::string> read_session_text(const FieldReader& r, std::string_view key,
                                             const ProtocolLimits& limits);

}  // namespace weightcast::sync::wire
