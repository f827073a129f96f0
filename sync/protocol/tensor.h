// TensorMeta: what a weight tensor is, without its bytes — name, element type and shape — and
// the checked arithmetic that turns a shape received from outside into an allocation size.
//
// Shapes arrive in HTTP bodies, so every dimension and every product is checked: a negative
// dimension or an element/byte count that overflows int64 (or size_t) throws
// comm::BadRequestError naming the tensor and the dimension, before anyone allocates.
// Lifetime/threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sync/protocol/dtype.h"

namespace weightcast::sync {

// Longest tensor name accepted by default. Real parameter names are well under 200 bytes.
inline constexpr std::size_t kDefaultMaxNameLength = 1024;
// Most dimensions accepted in a shape (numpy's limit; torch tensors use far fewer).
inline constexpr std::size_t kMaxShapeRank = 64;

// Product of the dimensions of `shape` (1 for a scalar shape []). `what` names the shape in
// error messages: "shapes[3]" gives "shapes[3][1]: must be >= 0 (got -2)". Throws
// comm::BadRequestError on a negative dimension, more than kMaxShapeRank dimensions, or a
// product above INT64_MAX.
std::int64_t checked_numel(std::span<const std::int64_t> shape, std::string_view what);

// "[8, 4]": a shape as messages print it.
std::string shape_text(std::span<const std::int64_t> shape);

// checked_numel() times element_size(dtype), as an allocation size. Throws
// comm::BadRequestError when the product exceeds INT64_MAX or SIZE_MAX, so the result also fits
// the signed offsets the data path computes with.
std::size_t checked_byte_count(DType dtype, std::span<const std::int64_t> shape,
                               std::string_view what);
// The same byte count without a message: nullopt wherever checked_byte_count() would throw.
std::optional<std::size_t> valid_byte_count(DType dtype,
                                            std::span<const std::int64_t> shape) noexcept;

struct TensorMeta {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;

  // Checked as above; errors name the tensor ("tensor 'w' shape[1]: must be >= 0 (got -2)").
  std::int64_t numel() const;
  std::size_t byte_count() const;

  bool operator==(const TensorMeta&) const = default;
};

// Throws comm::BadRequestError naming `field` unless `name` is a valid tensor name: non-empty,
// at most `max_length` bytes, printable ASCII without whitespace.
void validate_tensor_name(std::string_view name, std::string_view field,
                          std::size_t max_length = kDefaultMaxNameLength);

// Validates the name (against `max_name_length`), every dimension and the byte count.
void validate(const TensorMeta& meta, std::size_t max_name_length = kDefaultMaxNameLength);

}  // namespace weightcast::sync
