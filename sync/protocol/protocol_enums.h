// Small closed vocabularies of the engine HTTP API besides selectors and dtypes: the data-plane
// backend a weight update group uses, how pause_generation treats running requests, how a group
// meets, how bucket tensors travel and how a delta bucket is encoded.
//
// Each enum has one table of wire spellings (comm/enum_names.h), returned by its wire_names()
// overload; LoadFormat, one of whose values has no spelling (the field is absent), keeps its own
// table and parse_load_format(). Each parse_* accepts exactly the wire spelling and throws
// comm::BadRequestError quoting the value and listing the valid ones; to_string gives the wire
// spelling back. Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <array>
#include <string_view>
#include <type_traits>

#include "comm/enum_names.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {

// An enum with a wire_names(E) overload (found by argument-dependent lookup) returning its
// comm::EnumNames table.
template <typename E>
concept WireEnum = std::is_enum_v<E> && requires(E value) {
  wire_names(value).name(value);
};

// The value of WireEnum E spelled exactly `text`; anything else throws comm::BadRequestError.
template <WireEnum E>
E parse_wire(std::string_view text) {
  return parse_name(wire_names(E{}), text);
}

// The wire spelling of `value`; a value outside its table (a corrupt enum) throws EnforceError.
template <WireEnum E>
std::string_view to_string(E value) {
  return wire_names(value).name(value);
}

// "nccl" (CUDA device buffers) or "gloo" (host buffers over TCP). SGLang passes any
// torch.distributed backend name through; we accept the two we implement.
enum class Backend { kNccl, kGloo };
constexpr auto wire_names(Backend) {
  return comm::enum_names<Backend>("backend", {{Backend::kNccl, "nccl"}, {Backend::kGloo, "gloo"}});
}
inline constexpr std::array<Backend, 2> kAllBackends = wire_names(Backend{}).values();
inline constexpr auto& parse_backend = parse_wire<Backend>;

// SGLang's pause modes: "abort" returns running requests, "retract" moves them back to the
// waiting queue, "in_place" keeps them (and their KV cache) where they are.
enum class PauseMode { kAbort, kRetract, kInPlace };
constexpr auto wire_names(PauseMode) {
  return comm::enum_names<PauseMode>("pause mode", {{PauseMode::kAbort, "abort"},
                                                    {PauseMode::kRetract, "retract"},
                                                    {PauseMode::kInPlace, "in_place"}});
}
inline constexpr std::array<PauseMode, 3> kAllPauseModes = wire_names(PauseMode{}).values();
inline constexpr auto& parse_pause_mode = parse_wire<PauseMode>;

// How an engine meets its group (init_weights_update_group's optional "rendezvous"):
// "weightcast" (our token-checked store, chain broadcast) or "torch" (a torch c10d TCPStore,
// a group torch.distributed members can join; the engine detects the store's torch generation),
// "torch1" / "torch2" (the same, with the generation whose wire and key chain the group's torch
// members use: the trainer learned it from them). Absent on the wire: the engine detects it.
enum class Rendezvous { kWeightcast, kTorch, kTorch1, kTorch2 };
constexpr auto wire_names(Rendezvous) {
  return comm::enum_names<Rendezvous>("rendezvous", {{Rendezvous::kWeightcast, "weightcast"},
                                                     {Rendezvous::kTorch, "torch"},
                                                     {Rendezvous::kTorch1, "torch1"},
                                                     {Rendezvous::kTorch2, "torch2"}});
}
inline constexpr std::array<Rendezvous, 4> kAllRendezvous = wire_names(Rendezvous{}).values();
inline constexpr auto& parse_rendezvous = parse_wire<Rendezvous>;

// How a bucket request's tensors travel (update_weights_from_distributed's "load_format"):
//   kPerTensor        absent on the wire: one broadcast per tensor, in `names` order (Miles);
//   kFlattenedBucket  "flattened_bucket": one broadcast of SGLang's unpadded bucket, the
//                     tensors' bytes back to back in `names` order;
//   kWeightcastBucket "weightcast_bucket": one broadcast of our bucket, each tensor 256-byte
//                     aligned (sync/model/bucket.h).
enum class LoadFormat { kPerTensor, kFlattenedBucket, kWeightcastBucket };
inline constexpr std::array<LoadFormat, 3> kAllLoadFormats = {
    LoadFormat::kPerTensor, LoadFormat::kFlattenedBucket, LoadFormat::kWeightcastBucket};
// The formats with a wire spelling (kPerTensor has none: the field is absent).
inline constexpr auto kBucketFormatNames = comm::enum_names<LoadFormat>(
    "load format", {{LoadFormat::kFlattenedBucket, "flattened_bucket"},
                    {LoadFormat::kWeightcastBucket, "weightcast_bucket"}});
// "flattened_bucket" or "weightcast_bucket".
inline LoadFormat parse_load_format(std::string_view text) {
  return parse_name(kBucketFormatNames, text, ", or absent for one broadcast per tensor");
}
// kPerTensor: "per_tensor" (for messages).
inline std::string_view to_string(LoadFormat format) {
  return format == LoadFormat::kPerTensor ? "per_tensor" : kBucketFormatNames.name(format);
}

// How a delta bucket's payload is encoded (the bucket request's "delta.codec"; the codecs are in
// sync/model/delta.h): "xor_zstd", "xor_lz4" or "sparse".
enum class DeltaCodec { kXorZstd, kXorLz4, kSparse };
constexpr auto wire_names(DeltaCodec) {
  return comm::enum_names<DeltaCodec>("delta codec", {{DeltaCodec::kXorZstd, "xor_zstd"},
                                                      {DeltaCodec::kXorLz4, "xor_lz4"},
                                                      {DeltaCodec::kSparse, "sparse"}});
}
inline constexpr std::array<DeltaCodec, 3> kAllDeltaCodecs = wire_names(DeltaCodec{}).values();
inline constexpr auto& parse_delta_codec = parse_wire<DeltaCodec>;
inline std::string_view to_string(DeltaCodec codec) {
  return wire_names(codec).name_or(codec, "?");
}

}  // namespace weightcast::sync
