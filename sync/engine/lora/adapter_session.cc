#include "sync/engine/lora/adapter_session.h"

#include <cstring>
#include <unordered_map>

#include "comm/errors.h"

namespace weightcast::sync::engine {

AdapterTarget adapter_target(const LoraBegin& begin) {
  try {
    return {begin.name, parse_lora_config(begin.config_json),
            begin.upsert ? AdapterStore::Put::kUpsert : AdapterStore::Put::kLoad};
  } catch (const comm::BadRequestError& e) {
    throw comm::BadRequestError(std::string("lora.") + e.what());
  }
}

void check_adapter_begin(Selector selector, const AdapterTarget& target) {
  if (selector != Selector::kTarget) {
    throw ReceiverError(400, "selector: '" + std::string(to_string(selector)) +
                                 "' with lora: adapters apply to the target model only; begin "
                                 "the adapter's update with selector \"target\"");
  }
  try {
    validate_adapter_name(target.name, "lora.lora_name");
  } catch (const comm::BadRequestError& e) {
    throw ReceiverError(400, e.what());
  }
}

DeltaBaseSource adapter_base_source(std::shared_ptr<const Adapter> held) {
  std::unordered_map<std::string, std::size_t> index;
  if (held) {
    for (std::size_t j = 0; j < held->tensors.size(); ++j) index[held->tensors[j].name] = j;
  }
  return [held = std::move(held), index = std::move(index)](
             const BucketPlan& plan, const std::vector<std::vector<Runner>>& destinations,
             const std::vector<Digest>& expected, const std::string& base_version,
             std::span<std::byte> bucket,
             const ShardPlan*) -> std::optional<std::string> {  // adapters go whole
    WC_ENFORCE_EQ(bucket.size(), plan.total_bytes, "delta base buffer");
    WC_ENFORCE_EQ(destinations.size(), plan.entries.size());
    WC_ENFORCE_EQ(expected.size(), plan.entries.size());
    if (!held) return "delta base: no adapter is held under this name; send the bucket in full";
    std::memset(bucket.data(), 0, bucket.size());
    for (std::size_t i = 0; i < plan.entries.size(); ++i) {
      const BucketEntry& entry = plan.entries[i];
      if (destinations[i].empty() || entry.bytes == 0) continue;
      const std::string where = "delta base of tensor '" + entry.meta.name + "' in adapter '" +
                                held->name + "' version '" + held->version + "'";
      const auto it = index.find(entry.meta.name);
      if (it == index.end() || held->bytes[it->second].size() != entry.bytes) {
        return where + ": not held with " + std::to_string(entry.bytes) +
               " bytes (the delta's base_version is '" + base_version +
               "'); send the bucket in full";
      }
      const auto out = bucket.subspan(entry.offset, entry.bytes);
      std::memcpy(out.data(), held->bytes[it->second].data(), entry.bytes);
      const Digest digest = tensor_digest(out);
      if (digest != expected[i]) {
        return where + ": the engine holds digest " + to_string(digest) +
               ", the delta was computed against digest " + to_string(expected[i]) +
               " at base_version '" + base_version + "'; send the bucket in full";
      }
    }
    return std::nullopt;
  };
}

std::vector<std::vector<Runner>> route_adapter_tensors(
    const AdapterTarget& target, const std::vector<TensorMeta>& tensors,
    const std::unordered_set<std::string>& sent) {
  std::vector<std::vector<Runner>> out;
  out.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].name;
    const std::string where = "names[" + std::to_string(i) + "]: ";
    if (sent.count(name)) {
      throw ReceiverError(400, where + "'" + name + "' was already sent in this session");
    }
    try {
      adapted_module(target.config, name);
    } catch (const comm::BadRequestError& e) {
      throw ReceiverError(400,
                          where + e.what() + "; the session updates adapter '" + target.name + "'");
    }
    out.push_back({Runner::kTarget});
  }
  return out;
}

std::shared_ptr<const Adapter> build_adapter(const AdapterTarget& target,
                                             const std::map<std::string, StagedTensor>& staged,
                                             const ReceiverRunner* runner,
                                             const std::string& version) {
  if (runner == nullptr || !runner->shape_of) {
    throw ReceiverError(400,
                        "lora: this engine's target runner reports no base weight shapes, "
                        "so it cannot check an adapter against them");
  }
  auto adapter = std::make_shared<Adapter>();
  adapter->name = target.name;
  adapter->config = target.config;
  adapter->version = version;
  std::map<std::string, std::vector<std::int64_t>> base;
  for (const auto& [name, t] : staged) {
    adapter->tensors.push_back(t.meta);
    adapter->bytes.push_back(t.bytes);
    WC_ENFORCE(!t.rank_digests.empty() && t.rank_digests[0].has_value(), "staged digest of ", name);
    adapter->digests.push_back(*t.rank_digests[0]);
    if (const auto lora = parse_lora_tensor_name(name)) {  // others: refused by check_adapter
      const std::string weight = lora->module + ".weight";
      if (auto shape = runner->shape_of(weight)) base[weight] = std::move(*shape);
    }
  }
  try {
    check_adapter(target.config, adapter->tensors, base);
  } catch (const comm::BadRequestError& e) {
    throw ReceiverError(400, std::string(e.what()) + "; adapter '" + target.name +
                                 "' is not swapped in (what it held before is kept)");
  }
  return adapter;
}

}  // namespace weightcast::sync::engine
