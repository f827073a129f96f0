#include "sync/protocol/dtype.h"

#include <array>
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

constexpr std::array<DTypeInfo, 12> kInfo = {{
    {DType::kFloat32, "float32", 4},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat64, "float64", 8},
    {DType::kFloat8E4M3Fn, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
    {DType::kInt8, "int8", 1},
    {DType::kUInt8, "uint8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kBool, "bool", 1},
}};

// The canonical names of kInfo, for parsing and the list of valid names.
constexpr auto kNames = [] {
  std::array<std::pair<DType, std::string_view>, kInfo.size()> entries{};
  for (std::size_t i = 0; i < kInfo.size(); ++i) entries[i] = {kInfo[i].dtype, kInfo[i].name};
  return comm::EnumNames<DType, kInfo.size()>("dtype", entries);
}();

// torch module attributes that are aliases of the dtypes above.
constexpr auto kAliases = comm::enum_names<DType>("dtype alias", {{DType::kFloat16, "half"},
                                                                  {DType::kFloat32, "float"},
                                                                  {DType::kFloat64, "double"},
                                                                  {DType::kInt16, "short"},
                                                                  {DType::kInt32, "int"},
                                                                  {DType::kInt64, "long"}});

// info() indexes kInfo by enum value, so the table must list the enum in declaration order.
constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < kInfo.size(); ++i) {
    if (static_cast<std::size_t>(kInfo[i].dtype) != i) return false;
  }
  return true;
}
static_assert(in_enum_order());

constexpr std::array<DType, kInfo.size()> kAll = kNames.values();

const DTypeInfo& info(DType dtype) {
  const auto index = static_cast<std::size_t>(dtype);
  WC_ENFORCE_LT(index, kInfo.size(), "invalid DType value");
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
