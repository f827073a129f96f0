// LoRA adapters as payloads (docs/lora.md): PEFT's naming and config, and the checks an adapter
// passes before an engine stages it.
//
// PEFT names an adapter's tensors `base_model.model.<module>.lora_A.weight` and
// `base_model.model.<module>.lora_B.weight`, where <module> is the base layer's name without
// `.weight` (model.layers.0.self_attn.q_proj); the prefix is optional here. For a base weight
// [out, in], A is [r, in] and B is [out, r]; the adapter adds (lora_alpha / r) · B · A to it.
// The config is PEFT's adapter_config.json subset that decides those shapes and the scale:
// {"r", "lora_alpha", "target_modules"}; other keys are kept as given (to_json round-trips them).
// Errors: comm::BadRequestError naming the field or the tensor.
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sync/protocol/tensor.h"

namespace weightcast::sync {

struct LoraConfig {
  int r = 0;
  double lora_alpha = 0;
  std::vector<std::string> target_modules;  // last name components: q_proj, v_proj, ...
  std::string extra_json = "{}";            // the other keys, as given

  double scaling() const { return lora_alpha / r; }
  bool targets(std::string_view module) const;  // whether module's last component is targeted
};

// `json`: an object with r (1..65536), lora_alpha (> 0), target_modules (non-empty list of names).
LoraConfig parse_lora_config(std::string_view json);
std::string to_json_string(const LoraConfig& config);

// An adapter's name: what requests name it by (SGLang's and vLLM's lora_name). 1..128 bytes of
// letters, digits and ._-; BadRequestError naming `field` otherwise.
void validate_adapter_name(std::string_view name, std::string_view field = "lora_name");

enum class LoraPart { kA, kB };
struct LoraTensorName {
  std::string module;  // without the base_model.model. prefix
  LoraPart part = LoraPart::kA;
};
// nullopt unless `name` is a LoRA tensor name in PEFT's form.
std::optional<LoraTensorName> parse_lora_tensor_name(std::string_view name);
// PEFT's name for `module`'s A or B.
std::string lora_tensor_name(std::string_view module, LoraPart part);

// The module `tensor_name` adapts: BadRequestError unless it is a LoRA tensor name in PEFT's form
// of a module `config` targets. The one rule a bucket's names and check_adapter() both apply.
LoraTensorName adapted_module(const LoraConfig& config, std::string_view tensor_name);

// Checks that `tensors` are an adapter of `config` over a base whose weights have the shapes in
// `base_shapes` (name -> shape): every tensor a LoRA tensor of a targeted module, each module with
// exactly one A and one B, A [r, in] and B [out, r] for a base weight `<module>.weight` of shape
// [out, in]. BadRequestError naming the first tensor that is not.
void check_adapter(const LoraConfig& config, const std::vector<TensorMeta>& tensors,
                   const std::map<std::string, std::vector<std::int64_t>>& base_shapes);

}  // namespace weightcast::sync
