#include "sync/protocol/dtype.h"

#include <array>
#include <iterator>
#include <string>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
};

// One entry per DType, from the same list as the enum, so kInfo[d] describes DType d.
constexpr DTypeInfo kInfo[] = {
#define WEIGHTCAST_DTYPE(enumerator, name, size, safetensors_code) {DType::enumerator, name, size},
#include "sync/protocol/dtypes.def"
};

// The canonical names of kInfo, for parsing and the list of valid names.
constexpr auto kNames = [] {
  std::array<std::pair<DType, std::string_view>, std::size(kInfo)> entries{};
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i] = {kInfo[i].dtype, kInfo[i].name};
  return comm::EnumNames<DType, std::size(kInfo)>("dtype", entries);
}();

// torch module attributes that are aliases of the dtypes above.
constexpr auto kAliases = comm::enum_names<DType>("dtype alias", {{DType::kFloat16, "half"},
                                                                  {DType::kFloat32, "float"},
                                                                  {DType::kFloat64, "double"},
                                                                  {DType::kInt16, "short"},
                                                                  {DType::kInt32, "int"},
                                                                  {DType::kInt64, "long"}});

constexpr std::array<DType, std::size(kInfo)> kAll = kNames.values();

const DTypeInfo& info(DType dtype) {
  const auto index = static_cast<std::size_t>(dtype);
  WC_ENFORCE_LT(index, std::size(kInfo), "invalid DType value");
  return kInfo[index];
}

}  // namespace

std::span<const DType> all_dtypes() {
  return kAll;
}

DType parse_dtype(std::string_view text) {
  std::string_view name = text;
  if (name.starts_with("torch.")) name.remove_prefix(6);
  if (auto dtype = kNames.find(name)) return *dtype;
  if (auto dtype = kAliases.find(name)) return *dtype;
  throw comm::BadRequestError("unknown dtype " + quoted(text) + " (valid: " + kNames.list() + ")");
}

std::string_view to_string(DType dtype) {
  return info(dtype).name;
}

std::size_t element_size(DType dtype) {
  return info(dtype).size;
}

}  // namespace weightcast::sync
