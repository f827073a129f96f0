#include "comm/nccl/nccl_unique_id.h"

#include <cstring>
#include <string_view>

#include "comm/errors.h"
#include "comm/nccl/nccl_compat.h"

namespace weightcast::comm {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes,
              "kNcclUniqueIdBytes must match NCCL_UNIQUE_ID_BYTES");

NcclUniqueIdBytes create_nccl_unique_id() {
  nccl_compat::check_runtime_version();
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    throw ConfigError("ncclGetUniqueId failed: " + nccl_compat::describe(result, nullptr));
  }
  NcclUniqueIdBytes out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

void publish_unique_id(Store& store, const NcclUniqueIdBytes& id, Millis timeout,
                       const std::string& key) {
  store.set(key, std::string_view(id.data(), id.size()), timeout);
}

NcclUniqueIdBytes fetch_unique_id(Store& store, Millis timeout, const std::string& key) {
  const std::string value = store.get(key, timeout);
  if (value.size() != kNcclUniqueIdBytes) {
    throw BadRequestError(detail::concat("store key '", key, "' holds ", value.size(),
                                         " bytes, an NCCL unique id has ", kNcclUniqueIdBytes));
  }
  NcclUniqueIdBytes out;
  std::memcpy(out.data(), value.data(), out.size());
  return out;
}

}  // namespace weightcast::comm
