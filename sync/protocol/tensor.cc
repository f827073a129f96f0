#include "sync/protocol/tensor.h"

#include <limits>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
// Byte counts become size_t buffer sizes; on a platform where size_t is narrower than int64 the
// tighter bound applies.
constexpr std::int64_t kByteCountMax =
    static_cast<std::uint64_t>(std::numeric_limits<std::size_t>::max()) <
            static_cast<std::uint64_t>(kInt64Max)
        ? static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max())
        : kInt64Max;

std::string shape_label(const TensorMeta& meta) {
  return "tensor " + quoted(meta.name) + " shape";
}

}  // namespace

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::int64_t checked_numel(std::span<const std::int64_t> shape, std::string_view what) {
  if (shape.size() > kMaxShapeRank) {
    throw comm::BadRequestError(std::string(what) + ": " + std::to_string(shape.size()) +
                                " dimensions, more than the limit of " +
                                std::to_string(kMaxShapeRank));
  }
  // Check every dimension first so a negative one is reported even after a zero dimension.
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      throw comm::BadRequestError(std::string(what) + "[" + std::to_string(i) +
                                  "]: must be >= 0 (got " + std::to_string(shape[i]) + ")");
    }
  }
  std::int64_t n = 1;
  bool has_zero = false;
  for (std::int64_t d : shape) has_zero = has_zero || d == 0;
  if (has_zero) return 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (n > kInt64Max / shape[i]) {
      throw comm::BadRequestError(std::string(what) + ": element count overflows int64 at [" +
                                  std::to_string(i) + "]");
    }
    n *= shape[i];
  }
  return n;
}

std::optional<std::size_t> valid_byte_count(DType dtype,
                                            std::span<const std::int64_t> shape) noexcept {
  if (shape.size() > kMaxShapeRank) return std::nullopt;
  // An invalid dtype throws in element_size(): no byte count here, and checked_byte_count()
  // reports it as it always did.
  std::int64_t size = 0;
  try {
    size = static_cast<std::int64_t>(element_size(dtype));
  } catch (...) {
    return std::nullopt;
  }
  bool has_zero = false;
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    has_zero = has_zero || d == 0;
  }
  if (has_zero) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (n > kInt64Max / d) return std::nullopt;
    n *= d;
  }
  if (n > kByteCountMax / size) return std::nullopt;
  return static_cast<std::size_t>(n * size);
}

std::size_t checked_byte_count(DType dtype, std::span<const std::int64_t> shape,
                               std::string_view what) {
  if (const auto bytes = valid_byte_count(dtype, shape)) return *bytes;
  const std::int64_t n = checked_numel(shape, what);
  const auto size = static_cast<std::int64_t>(element_size(dtype));
  if (n > kByteCountMax / size) {
    throw comm::BadRequestError(std::string(what) + ": byte count (" + std::to_string(n) + " x " +
                                std::to_string(size) + " bytes of " +
                                std::string(to_string(dtype)) + ") overflows int64/size_t");
  }
  return static_cast<std::size_t>(n * size);
}

std::int64_t TensorMeta::numel() const {
  // The label (a copy of the name) only for an error: this runs for every tensor of a bucket.
  if (const auto bytes = valid_byte_count(dtype, shape)) {
    return static_cast<std::int64_t>(*bytes / element_size(dtype));
  }
  return checked_numel(shape, shape_label(*this));
}

std::size_t TensorMeta::byte_count() const {
  if (const auto bytes = valid_byte_count(dtype, shape)) return *bytes;
  return checked_byte_count(dtype, shape, shape_label(*this));
}

void validate_tensor_name(std::string_view name, std::string_view field, std::size_t max_length) {
  validate_identifier(name, max_length, field);
}

void validate(const TensorMeta& meta, std::size_t max_name_length) {
  validate_tensor_name(meta.name, "tensor name", max_name_length);
  (void)meta.byte_count();
}

}  // namespace weightcast::sync
