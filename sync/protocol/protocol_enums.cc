#include "sync/protocol/protocol_enums.h"

#include <string>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

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

Rendezvous parse_rendezvous(std::string_view text) {
  for (Rendezvous r : kAllRendezvous) {
    if (text == to_string(r)) return r;
  }
  throw comm::BadRequestError("unknown rendezvous " + quoted(text) + " (valid: weightcast, torch)");
}

std::string_view to_string(Rendezvous rendezvous) {
  switch (rendezvous) {
    case Rendezvous::kWeightcast:
      return "weightcast";
    case Rendezvous::kTorch:
      return "torch";
  }
  WC_ENFORCE(false, "invalid Rendezvous value ", static_cast<int>(rendezvous));
  return {};
}

LoadFormat parse_load_format(std::string_view text) {
  if (text == to_string(LoadFormat::kFlattenedBucket)) return LoadFormat::kFlattenedBucket;
  if (text == to_string(LoadFormat::kWeightcastBucket)) return LoadFormat::kWeightcastBucket;
  throw comm::BadRequestError("unknown load format " + quoted(text) +
                              " (valid: flattened_bucket, weightcast_bucket, or absent for one "
                              "broadcast per tensor)");
}

std::string_view to_string(LoadFormat format) {
  switch (format) {
    case LoadFormat::kPerTensor:
      return "per_tensor";
    case LoadFormat::kFlattenedBucket:
      return "flattened_bucket";
    case LoadFormat::kWeightcastBucket:
      return "weightcast_bucket";
  }
  WC_ENFORCE(false, "invalid LoadFormat value ", static_cast<int>(format));
  return {};
}

DeltaCodec parse_delta_codec(std::string_view text) {
  for (DeltaCodec codec : kAllDeltaCodecs) {
    if (text == to_string(codec)) return codec;
  }
  throw comm::BadRequestError("unknown delta codec " + quoted(text) +
                              " (valid: xor_zstd, xor_lz4, sparse)");
}

std::string_view to_string(DeltaCodec codec) {
  switch (codec) {
    case DeltaCodec::kXorZstd:
      return "xor_zstd";
    case DeltaCodec::kXorLz4:
      return "xor_lz4";
    case DeltaCodec::kSparse:
      return "sparse";
  }
  return "?";
}

}  // namespace weightcast::sync
