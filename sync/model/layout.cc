#include "sync/model/layout.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

constexpr std::size_t kGroups = kTileRowBytes / kLaneGroupBytes;  // lane groups per tile row
constexpr std::size_t kTileBytes = kTileRows * kTileRowBytes;

// The tensor seen as a row-major byte matrix.
struct Geometry {
  std::size_t rows = 0;       // R
  std::size_t row_bytes = 0;  // C * element size
  std::size_t full_rows = 0;  // R rounded down to whole tiles
  std::size_t tiles_per_band = 0;
};

Geometry geometry(std::size_t total_bytes, std::size_t element_size,
                  std::span<const std::int64_t> shape) {
  WC_ENFORCE(element_size == 1 || element_size == 2 || element_size == 4 || element_size == 8,
             "shuffle needs an element size of 1, 2, 4 or 8, got ", element_size);
  std::uint64_t rows = 1;
  std::uint64_t cols = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    WC_ENFORCE_GE(shape[i], 0, "negative dimension ", i);
    const auto d = static_cast<std::uint64_t>(shape[i]);
    if (i + 1 == shape.size()) {
      cols = d;
    } else {
      WC_ENFORCE(d == 0 || rows <= std::numeric_limits<std::uint64_t>::max() / d,
                 "shape overflows");
      rows *= d;
    }
  }
  WC_ENFORCE(cols == 0 || rows <= std::numeric_limits<std::uint64_t>::max() / cols,
             "shape overflows");
  const std::uint64_t numel = rows * cols;
  WC_ENFORCE(numel <= std::numeric_limits<std::uint64_t>::max() / element_size, "shape overflows");
  WC_ENFORCE_EQ(static_cast<std::uint64_t>(total_bytes), numel * element_size,
                "buffer size does not match shape x element size");
  Geometry g;
  g.rows = static_cast<std::size_t>(rows);
  g.row_bytes = static_cast<std::size_t>(cols) * element_size;
  g.full_rows = g.rows - g.rows % kTileRows;
  g.tiles_per_band = g.row_bytes / kTileRowBytes;
  return g;
}

// kIndex<F>[q * kGroups + g]: the group of the source tile (counted row by row) that lands at
// row q, group g of the destination tile.
template <bool kForward>
constexpr std::array<std::uint8_t, kTileRows * kGroups> make_index() {
  std::array<std::uint8_t, kTileRows * kGroups> index{};
  for (std::size_t p = 0; p < kTileRows * kGroups; ++p) {
    // Forward: position p = g * 16 + (r + g) % 16 holds group g of row r, so p holds group
    // g = p / 16 of row r = (p % 16 - g) mod 16. Inverse: group g = p % 4 of row r = p / 4 comes
    // back from position g * 16 + (r + g) % 16.
    const std::size_t g = kForward ? p / kTileRows : p % kGroups;
    const std::size_t r = kForward ? (p % kTileRows + kTileRows - g) % kTileRows : p / kGroups;
    index[p] =
        static_cast<std::uint8_t>(kForward ? r * kGroups + g : g * kTileRows + (r + g) % kTileRows);
  }
  return index;
}

template <bool kForward>
void transform_tiles(const std::byte* src, std::byte* dst, const Geometry& geo) {
  static constexpr auto kIndex = make_index<kForward>();
  alignas(64) std::byte tmp[kTileBytes];
  for (std::size_t band = 0; band < geo.full_rows; band += kTileRows) {
    const std::byte* s = src + band * geo.row_bytes;
    std::byte* d = dst + band * geo.row_bytes;
    for (std::size_t t = 0; t < geo.tiles_per_band; ++t) {
      const std::size_t col = t * kTileRowBytes;
      // Through tmp, so that src == dst works and the writes below stream row by row.
      for (std::size_t r = 0; r < kTileRows; ++r) {
        std::memcpy(tmp + r * kTileRowBytes, s + r * geo.row_bytes + col, kTileRowBytes);
      }
      for (std::size_t q = 0; q < kTileRows; ++q) {
        std::byte* out = d + q * geo.row_bytes + col;
        for (std::size_t g = 0; g < kGroups; ++g) {
          std::memcpy(out + g * kLaneGroupBytes, tmp + kIndex[q * kGroups + g] * kLaneGroupBytes,
                      kLaneGroupBytes);
        }
      }
    }
  }
}

// Copies what the tiles do not cover; nothing to do in place.
void copy_remainder(const std::byte* src, std::byte* dst, const Geometry& geo) {
  if (src == dst) return;
  const std::size_t tiled = geo.tiles_per_band * kTileRowBytes;
  if (tiled < geo.row_bytes) {
    for (std::size_t r = 0; r < geo.full_rows; ++r) {
      std::memcpy(dst + r * geo.row_bytes + tiled, src + r * geo.row_bytes + tiled,
                  geo.row_bytes - tiled);
    }
  }
  const std::size_t done = geo.full_rows * geo.row_bytes;
  const std::size_t total = geo.rows * geo.row_bytes;
  if (total > done) std::memcpy(dst + done, src + done, total - done);
}

template <bool kForward>
void transform(const std::byte* src, std::byte* dst, std::size_t bytes, std::size_t element_size,
               std::span<const std::int64_t> shape) {
  const Geometry geo = geometry(bytes, element_size, shape);
  if (geo.full_rows > 0 && geo.tiles_per_band > 0) transform_tiles<kForward>(src, dst, geo);
  copy_remainder(src, dst, geo);
}

void check_copy_spans(std::span<const std::byte> src, std::span<std::byte> dst) {
  WC_ENFORCE_EQ(src.size(), dst.size(), "shuffle source and destination differ in size");
  if (src.data() == dst.data() || src.empty()) return;
  const auto* s = src.data();
  const auto* d = dst.data();
  WC_ENFORCE(s + src.size() <= d || d + dst.size() <= s,
             "shuffle source and destination partially overlap");
}

constexpr auto kLayouts =
    comm::enum_names<Layout>("layout", {{Layout::kNone, "none"}, {Layout::kShuffle, "shuffle"}});

}  // namespace

Layout parse_layout(std::string_view text) {
  return sync::parse_name(kLayouts, text);
}

std::string_view to_string(Layout layout) {
  return kLayouts.name(layout);
}

bool shuffle_moves(std::span<const std::int64_t> shape, std::size_t element_size) {
  WC_ENFORCE(element_size == 1 || element_size == 2 || element_size == 4 || element_size == 8,
             "shuffle needs an element size of 1, 2, 4 or 8, got ", element_size);
  if (shape.size() < 2) return false;
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) {
    if (shape[i] <= 0) return false;
    // Saturates at 16: only "at least one tile of rows" matters, and it cannot overflow.
    rows = std::min<std::int64_t>(rows * std::min<std::int64_t>(shape[i], kTileRows), kTileRows);
  }
  return rows == static_cast<std::int64_t>(kTileRows) &&
         shape.back() >= static_cast<std::int64_t>(kTileRowBytes / element_size);
}

void shuffle_in_place(std::span<std::byte> bytes, std::size_t element_size,
                      std::span<const std::int64_t> shape) {
  transform<true>(bytes.data(), bytes.data(), bytes.size(), element_size, shape);
}

void unshuffle_in_place(std::span<std::byte> bytes, std::size_t element_size,
                        std::span<const std::int64_t> shape) {
  transform<false>(bytes.data(), bytes.data(), bytes.size(), element_size, shape);
}

void shuffle_copy(std::span<const std::byte> src, std::span<std::byte> dst,
                  std::size_t element_size, std::span<const std::int64_t> shape) {
  check_copy_spans(src, dst);
  transform<true>(src.data(), dst.data(), src.size(), element_size, shape);
}

void unshuffle_copy(std::span<const std::byte> src, std::span<std::byte> dst,
                    std::size_t element_size, std::span<const std::int64_t> shape) {
  check_copy_spans(src, dst);
  transform<false>(src.data(), dst.data(), src.size(), element_size, shape);
}

void apply_layout(Layout layout, const TensorMeta& meta, std::span<std::byte> bytes) {
  WC_ENFORCE_EQ(bytes.size(), meta.byte_count(), "bytes of tensor ", meta.name);
  if (layout == Layout::kNone) return;
  shuffle_in_place(bytes, element_size(meta.dtype), meta.shape);
}

void undo_layout(Layout layout, const TensorMeta& meta, std::span<std::byte> bytes) {
  WC_ENFORCE_EQ(bytes.size(), meta.byte_count(), "bytes of tensor ", meta.name);
  if (layout == Layout::kNone) return;
  unshuffle_in_place(bytes, element_size(meta.dtype), meta.shape);
}

}  // namespace weightcast::sync
