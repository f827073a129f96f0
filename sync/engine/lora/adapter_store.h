// The adapters an engine holds, by name (docs/lora.md): what a committed adapter update swaps in,
// what /server_info lists and /weights_checksum?lora=NAME reports.
//
// An Adapter is immutable once built: its config, its tensors (PEFT names, bytes, digests) and the
// version it was committed at. put() swaps a whole adapter in under its name at once: a reader
// sees the previous adapter or the new one, never a mix, and a reader that took a shared_ptr (a
// request that started with the adapter) keeps the one it took until it lets go. A put or unload
// that is refused changes nothing.
// Threading: every method is thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sync/engine/stage/block_pool.h"
#include "sync/model/checksum.h"
#include "sync/model/lora.h"
#include "sync/protocol/protocol_responses.h"

namespace weightcast::sync::engine {

struct Adapter {
  std::string name;
  LoraConfig config;
  std::vector<TensorMeta> tensors;
  std::vector<SharedBytes> bytes;  // parallel to tensors
  std::vector<Digest> digests;     // parallel to tensors
  std::string version;             // the weight_version it was committed with ("" when none)

  std::size_t byte_count() const;
  // The adapter's digest over its tensors, by name (as a runner's digest).
  Digest combined_digest() const;
};

// GET /weights_checksum?lora=NAME's answer (docs/protocol.md), as JSON text: the adapter's digests
// in the shape of a runner's checksum (runner target, weight_version the adapter's) plus
// lora_name and version. weightcast-engine and the Python Receiver answer with it alike.
std::string adapter_checksum_json(const Adapter& adapter);

class AdapterStore {
 public:
  enum class Put { kLoad, kUpsert };  // load refuses a name in use; upsert replaces it
  explicit AdapterStore(std::size_t max_adapters = 64) : max_(max_adapters) {}

  // Swaps `adapter` in under its name. ReceiverError 409 for kLoad of a name in use, 507 past
  // the limit of adapters held.
  void put(std::shared_ptr<const Adapter> adapter, Put how);
  // Drops `name`; requests holding it keep it. Whether it was held.
  bool unload(const std::string& name);
  // The adapter held under `name`, or null.
  std::shared_ptr<const Adapter> find(const std::string& name) const;
  std::vector<std::string> names() const;
  // Every adapter held, in name order (one lock: a listing sees one state of the store).
  std::vector<std::shared_ptr<const Adapter>> held() const;
  std::size_t size() const;

 private:
  const std::size_t max_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Adapter>> held_;
};

}  // namespace weightcast::sync::engine
