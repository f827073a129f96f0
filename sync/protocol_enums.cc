#include "sync/protocol_enums.h"

#include <string>

#include "comm/errors.h"
#include "sync/protocol_text.h"

namespace weightcast::sync {

Backend parse_backend(std::string_view text) {
  for (Backend b : kAllBackends) {
    if (text == to_string(b)) return b;
  }
  throw comm::BadRequestError("unknown backend " + quoted(text) + " (valid: nccl, gloo)");
}

std::string_view to_string(Backend backend) {
  switch (backend) {
    case Backend::kNccl:
      return "nccl";
    case Backend::kGloo:
      return "gloo";
  }
  WC_ENFORCE(false, "invalid Backend value ", static_cast<int>(backend));
  return {};
}

PauseMode parse_pause_mode(std::string_view text) {
  for (PauseMode m : kAllPauseModes) {
    if (text == to_string(m)) return m;
  }
  throw comm::BadRequestError("unknown pause mode " + quoted(text) +
                              " (valid: abort, retract, in_place)");
}

std::string_view to_string(PauseMode mode) {
  switch (mode) {
    case PauseMode::kAbort:
      return "abort";
    case PauseMode::kRetract:
      return "retract";
    case PauseMode::kInPlace:
      return "in_place";
  }
  WC_ENFORCE(false, "invalid PauseMode value ", static_cast<int>(mode));
  return {};
}

}  // namespace weightcast::sync
