// Element types of weight tensors, spelled as torch spells them.
//
// Trainers send dtypes as text. slime/Miles send str(tensor.dtype) with the "torch." prefix
// stripped ("bfloat16"); SGLang resolves them with getattr(torch, name), which also accepts
// torch's aliases ("half", "float", "double", "short", "int", "long"). Some trainer versions send
// str(torch.dtype) unchanged ("torch.bfloat16"). parse_dtype() accepts all of these; to_string()
// always gives the canonical name without prefix, so what we send SGLang also resolves.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace weightcast::sync {

// One enumerator per row of sync/protocol/dtypes.def, in its order: kFloat32, kFloat16, kBFloat16,
// ..., kInt64, kBool.
enum class DType {
#define WEIGHTCAST_DTYPE(enumerator, name, size, safetensors_code) enumerator,
#include "sync/protocol/dtypes.def"
};

// Every DType, in declaration order.
std::span<const DType> all_dtypes();

// Canonical names ("float32", ..., "float8_e4m3fn", "bool"), optionally prefixed with "torch.",
// plus torch's aliases. Anything else throws comm::BadRequestError quoting the value.
DType parse_dtype(std::string_view text);
std::string_view to_string(DType dtype);

// Bytes per element (torch.tensor([], dtype=d).element_size()): bool is one byte.
std::size_t element_size(DType dtype);

}  // namespace weightcast::sync
