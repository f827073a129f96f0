#include "sync/model/lora.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

using Json = nlohmann::json;
constexpr std::string_view kPrefix = "base_model.model.";
constexpr std::string_view kSuffixA = ".lora_A.weight";
constexpr std::string_view kSuffixB = ".lora_B.weight";

[[noreturn]] void bad(const std::string& what) {
  throw comm::BadRequestError(what);
}

std::string_view last_component(std::string_view module) {
  const auto dot = module.rfind('.');
  return dot == std::string_view::npos ? module : module.substr(dot + 1);
}

}  // namespace

bool LoraConfig::targets(std::string_view module) const {
  const std::string_view last = last_component(module);
  return std::find(target_modules.begin(), target_modules.end(), last) != target_modules.end();
}

LoraConfig parse_lora_config(std::string_view json) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) bad("config: must be a JSON object (PEFT's LoraConfig)");
  LoraConfig out;
  const auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer() || r->get<std::int64_t>() < 1 ||
      r->get<std::int64_t>() > 65536) {
    bad("config.r: required, an integer from 1 to 65536");
  }
  out.r = r->get<int>();
  const auto alpha = j.find("lora_alpha");
  if (alpha == j.end() || !alpha->is_number() || !(alpha->get<double>() > 0)) {
    bad("config.lora_alpha: required, a number above 0");
  }
  out.lora_alpha = alpha->get<double>();
  const auto modules = j.find("target_modules");
  if (modules == j.end() || !modules->is_array() || modules->empty()) {
    bad("config.target_modules: required, a non-empty list of module names (q_proj, v_proj, ...)");
  }
  for (const Json& m : *modules) {
    if (!m.is_string() || m.get_ref<const std::string&>().empty() ||
        m.get_ref<const std::string&>().find('.') != std::string::npos) {
      bad("config.target_modules: each entry must be a module name without dots");
    }
    out.target_modules.push_back(m.get<std::string>());
  }
  j.erase("r");
  j.erase("lora_alpha");
  j.erase("target_modules");
  out.extra_json = j.dump();
  return out;
}

std::string to_json_string(const LoraConfig& config) {
  Json j = Json::parse(config.extra_json);
  j["r"] = config.r;
  j["lora_alpha"] = config.lora_alpha;
  j["target_modules"] = config.target_modules;
  return j.dump();
}

void validate_adapter_name(std::string_view name, std::string_view field) {
  const bool ok =
      !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
      });
  if (!ok) {
    bad(std::string(field) + ": '" + std::string(name.substr(0, 64)) +
        "' must be 1 to 128 letters, digits, '.', '_' or '-'");
  }
}

std::optional<LoraTensorName> parse_lora_tensor_name(std::string_view name) {
  if (name.starts_with(kPrefix)) name.remove_prefix(kPrefix.size());
  LoraTensorName out;
  if (name.ends_with(kSuffixA)) {
    out.part = LoraPart::kA;
    name.remove_suffix(kSuffixA.size());
  } else if (name.ends_with(kSuffixB)) {
    out.part = LoraPart::kB;
    name.remove_suffix(kSuffixB.size());
  } else {
    return std::nullopt;
  }
  if (name.empty()) return std::nullopt;
  out.module = std::string(name);
  return out;
}

std::string lora_tensor_name(std::string_view module, LoraPart part) {
  return std::string(kPrefix) + std::string(module) +
         std::string(part == LoraPart::kA ? kSuffixA : kSuffixB);
}

LoraTensorName adapted_module(const LoraConfig& config, std::string_view tensor_name) {
  const std::string where = "'" + std::string(tensor_name) + "'";
  auto parsed = parse_lora_tensor_name(tensor_name);
  if (!parsed) {
    bad(where + " is not a LoRA tensor (PEFT names end in .lora_A.weight/.lora_B.weight)");
  }
  if (!config.targets(parsed->module)) {
    bad(where + ": module '" + std::string(last_component(parsed->module)) +
        "' is not in config.target_modules");
  }
  return std::move(*parsed);
}

void check_adapter(const LoraConfig& config, const std::vector<TensorMeta>& tensors,
                   const std::map<std::string, std::vector<std::int64_t>>& base_shapes) {
  if (tensors.empty()) bad("adapter: holds no tensor");
  std::map<std::string, std::set<LoraPart>> seen;
  for (const TensorMeta& t : tensors) {
    const LoraTensorName parsed = adapted_module(config, t.name);
    const std::string where = "adapter tensor '" + t.name + "'";
    if (!seen[parsed.module].insert(parsed.part).second) bad(where + ": appears twice");
    const auto base = base_shapes.find(parsed.module + ".weight");
    if (base == base_shapes.end() || base->second.size() != 2) {
      bad(where + ": the model has no 2-D weight '" + parsed.module + ".weight' to adapt");
    }
    const std::int64_t out = base->second[0];
    const std::int64_t in = base->second[1];
    const std::vector<std::int64_t> want = parsed.part == LoraPart::kA
                                               ? std::vector<std::int64_t>{config.r, in}
                                               : std::vector<std::int64_t>{out, config.r};
    if (t.shape != want) {
      bad(where + ": shape " + shape_text(t.shape) + ", expected " + shape_text(want) + " (r " +
          std::to_string(config.r) + ", base " + shape_text(base->second) + ")");
    }
  }
  for (const auto& [module, parts] : seen) {
    if (parts.size() != 2) {
      const LoraPart missing = parts.count(LoraPart::kA) ? LoraPart::kB : LoraPart::kA;
      bad("adapter: '" + lora_tensor_name(module, missing) +
          "' is missing (each module needs A and B)");
    }
  }
}

}  // namespace weightcast::sync
