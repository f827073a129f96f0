// Delta codecs: a bucket sent as its difference from the bytes the engines already hold.
//
// Between two RL steps most bfloat16 weights keep every bit (only elements whose fp32 master
// crosses a rounding boundary change), so `next XOR base` is almost all zero bytes. A delta
// payload encodes that XOR; the receiver rebuilds the base bytes in its own buffer and applies
// the payload to them, which gives `next` exactly: XOR is its own inverse, bit for bit, for any
// dtype. Three codecs, measured against each other by `weightcast-bench codec`
// (docs/performance.md, "Delta updates"):
//   - kXorZstd: the XOR, 1 MiB at a time, through one zstd stream (level 1);
//   - kXorLz4: the XOR in 1 MiB chunks, each an LZ4 block behind its 4-byte little-endian size;
//   - kSparse: the changed 16-bit words: an 8-byte little-endian count, then per word its index
//     (4 bytes) and its XOR (2 bytes), indices strictly increasing; for an odd size, the XOR of
//     the last byte after them.
// Encoders give up as soon as the payload would reach the caller's limit (checked as they go, by
// projecting the payload so far over the whole bucket, so a bucket where everything changed costs
// a fraction of an encode): the caller then sends the bucket in full. Decoders check everything
// they read: a payload that does not decode to exactly the buffer's size, a chunk or count out of
// range, an index out of order throw comm::BadRequestError, and the buffer must then be dropped.
// Lifetime/threading: an encoder or decoder holds its codec's context and a scratch chunk, reused
// call after call; one per thread.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "comm/non_copyable.h"
#include "sync/protocol/protocol_enums.h"

namespace weightcast::sync {

// The codec weightcast sends with unless told otherwise: the smallest on the drift benchmark at a
// speed that keeps up with the links (docs/performance.md).
inline constexpr DeltaCodec kDefaultDeltaCodec = DeltaCodec::kXorZstd;

class DeltaEncoder : comm::NonCopyable {
 public:
  explicit DeltaEncoder(DeltaCodec codec);
  ~DeltaEncoder();

  DeltaCodec codec() const { return codec_; }

  // Writes the payload turning `base` into `next` (equal sizes, else EnforceError) into `out`,
  // resized to the payload's size. Returns false, leaving `out` unspecified, when the payload
  // would be `limit` bytes or more.
  bool encode(std::span<const std::byte> next, std::span<const std::byte> base, std::size_t limit,
              std::vector<std::byte>& out);

 private:
  struct State;
  const DeltaCodec codec_;
  std::unique_ptr<State> state_;
};

class DeltaDecoder : comm::NonCopyable {
 public:
  explicit DeltaDecoder(DeltaCodec codec);
  ~DeltaDecoder();

  DeltaCodec codec() const { return codec_; }

  // `inout` holds the base on entry and the decoded bytes on return. Throws
  // comm::BadRequestError (see above) on a payload that is not a valid delta for its size.
  void decode(std::span<const std::byte> payload, std::span<std::byte> inout);

 private:
  struct State;
  const DeltaCodec codec_;
  std::unique_ptr<State> state_;
};

}  // namespace weightcast::sync
