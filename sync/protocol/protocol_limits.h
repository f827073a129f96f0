// ProtocolLimits: the bounds every body of the engine HTTP API is checked against while it is
// parsed, so a claimed size (a bucket's byte count, a list length) is rejected before anything
// is allocated for it.
//
// The engine server and the trainer client pass the same limits to the same parse functions
// (sync/protocol/protocol.h); the defaults suit models up to the trillion-parameter class.
// Lifetime/threading: a plain value.
#pragma once

#include <cstddef>

#include "sync/protocol/tensor.h"

namespace weightcast::sync {

struct ProtocolLimits {
  // Whole body, checked first. A bucket of 65536 tensors with long names is a few MiB; a
  // checksum listing of a large MoE model is tens of MiB.
  std::size_t max_body_bytes = 64u << 20;
  // Nesting of arrays and objects. The deepest body we define nests 3 levels
  // (shapes -> shape -> dimension); the margin leaves room for fields we ignore.
  std::size_t max_json_depth = 16;
  // Tensors in one update_weights_from_distributed bucket.
  std::size_t max_names_per_bucket = 1u << 16;
  // Sum of the byte counts of one bucket. The default bucket is 512 MiB, but a tensor larger than
  // that travels alone (a 256k x 16k fp32 embedding is 16 GiB).
  std::size_t max_bucket_bytes = std::size_t{64} << 30;
  // Tensor names and group names.
  std::size_t max_name_length = kDefaultMaxNameLength;
  // Other short strings: addresses, versions, layouts, digests.
  std::size_t max_string_length = 256;
  // Entries of a list in a response (runner filters, checksum tensors).
  std::size_t max_list_entries = 1u << 22;
};

}  // namespace weightcast::sync
