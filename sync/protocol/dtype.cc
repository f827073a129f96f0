#include "sync/protocol/dtype.h"

#include <array>
#include <iterator>
#include <string>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

// The canonical names and the element sizes, one per DType, from the same list as the enum (so
// kSizes[d] is DType d's size).
constexpr std::pair<DType, std::string_view> kNameEntries[] = {
#define WEIGHTCAST_DTYPE(enumerator, name, size, safetensors_code) {DType::enumerator, name},
#include "sync/protocol/dtypes.def"
};
constexpr auto kNames = comm::enum_names<DType>("dtype", kNameEntries);
constexpr std::size_t kSizes[] = {
#define WEIGHTCAST_DTYPE(enumerator, name, size, safetensors_code) size,
#include "sync/protocol/dtypes.def"
};

// torch module attributes that are aliases of the dtypes above.
constexpr auto kAliases = comm::enum_names<DType>("dtype alias", {{DType::kFloat16, "half"},
                                                                  {DType::kFloat32, "float"},
                                                                  {DType::kFloat64, "double"},
                                                                  {DType::kInt16, "short"},
                                                                  {DType::kInt32, "int"},
                                                                  {DType::kInt64, "long"}});

constexpr std::array<DType, std::size(kSizes)> kAll = kNames.values();

std::size_t index_of(DType dtype) {
  const auto index = static_cast<std::size_t>(dtype);
  WC_ENFORCE_LT(index, std::size(kSizes), "invalid DType value");
  return index;
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
  return kNameEntries[index_of(dtype)].second;
}

std::size_t element_size(DType dtype) {
  return kSizes[index_of(dtype)];
}

}  // namespace weightcast::sync
