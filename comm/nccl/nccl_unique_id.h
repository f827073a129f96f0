// The NCCL unique id and its trip through the rendezvous Store. Rank 0 of a group creates the id
// (ncclGetUniqueId, which also starts NCCL's bootstrap listener in this process) and publishes
// it; every other rank fetches it. The id is opaque bytes here, so this header needs no nccl.h.
//
// The key is fixed: scope each group (and each re-creation of a group) with its own PrefixStore,
// otherwise a late rank could read the id of an earlier group.
// Threading: the functions are thread-safe as far as the Store is.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "comm/deadline.h"
#include "comm/store.h"

namespace weightcast::comm {

inline constexpr std::size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES, checked in the .cc
inline constexpr const char* kNcclUniqueIdKey = "nccl_unique_id";

using NcclUniqueIdBytes = std::array<char, kNcclUniqueIdBytes>;

// ncclGetUniqueId. Throws ConfigError (with NCCL's reason) when NCCL cannot create one, e.g.
// when no usable network interface exists for its bootstrap.
NcclUniqueIdBytes create_nccl_unique_id();

// Stores `id` under `key` (kNcclUniqueIdKey in weightcast groups; torch_nccl_unique_id_key(0) in
// groups with torch members, where the raw 128 bytes are what ProcessGroupNCCL reads).
void publish_unique_id(Store& store, const NcclUniqueIdBytes& id, Millis timeout,
                       const std::string& key = kNcclUniqueIdKey);

// Waits up to `timeout` for the id under `key` (TimeoutError when it does not appear) and throws
// BadRequestError when the stored value is not exactly kNcclUniqueIdBytes long.
NcclUniqueIdBytes fetch_unique_id(Store& store, Millis timeout,
                                  const std::string& key = kNcclUniqueIdKey);

}  // namespace weightcast::comm
