#include "sync/engine/lora/adapter_store.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "comm/errors.h"
#include "sync/engine/commit/receiver_loader.h"

namespace weightcast::sync::engine {

std::size_t Adapter::byte_count() const {
  std::size_t out = 0;
  for (const auto& b : bytes) out += b.size();
  return out;
}

Digest Adapter::combined_digest() const {
  std::vector<NamedDigest> entries;
  for (std::size_t i = 0; i < tensors.size(); ++i) entries.push_back({tensors[i].name, digests[i]});
  return sync::combined_digest(std::move(entries));
}

void AdapterStore::put(std::shared_ptr<const Adapter> adapter, Put how) {
  WC_ENFORCE(adapter != nullptr, "AdapterStore::put: no adapter");
  WC_ENFORCE_EQ(adapter->tensors.size(), adapter->bytes.size(), "adapter bytes");
  WC_ENFORCE_EQ(adapter->tensors.size(), adapter->digests.size(), "adapter digests");
  std::lock_guard lock(mu_);
  const auto it = held_.find(adapter->name);
  if (it != held_.end() && how == Put::kLoad) {
    throw ReceiverError(409, "lora_name: an adapter '" + adapter->name +
                                 "' is already loaded; unload it first or send op \"upsert\"");
  }
  if (it == held_.end() && held_.size() >= max_) {
    throw ReceiverError(507, "lora_name: this engine holds its limit of " + std::to_string(max_) +
                                 " adapters; unload one first");
  }
  held_[adapter->name] = std::move(adapter);
}

bool AdapterStore::unload(const std::string& name) {
  std::lock_guard lock(mu_);
  return held_.erase(name) > 0;
}

std::shared_ptr<const Adapter> AdapterStore::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  const auto it = held_.find(name);
  return it == held_.end() ? nullptr : it->second;
}

std::vector<std::string> AdapterStore::names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, _] : held_) out.push_back(name);
  return out;
}

std::vector<std::shared_ptr<const Adapter>> AdapterStore::held() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const Adapter>> out;
  for (const auto& [_, adapter] : held_) out.push_back(adapter);
  return out;
}

std::size_t AdapterStore::size() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

std::string adapter_checksum_json(const Adapter& adapter) {
  WeightsChecksumResponse answer;
  answer.runner = Runner::kTarget;
  answer.weight_version = adapter.version;
  answer.digest = to_string(adapter.combined_digest());
  for (std::size_t i = 0; i < adapter.tensors.size(); ++i) {
    const TensorMeta& t = adapter.tensors[i];
    answer.tensors.push_back({t.name, to_string(adapter.digests[i]), t.dtype, t.shape});
  }
  auto j = nlohmann::json::parse(to_json_string(answer));
  j["lora_name"] = adapter.name;
  j["version"] = adapter.version;
  return j.dump();
}

}  // namespace weightcast::sync::engine
