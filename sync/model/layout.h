// Post-load layout transforms of weight tensors: `none`, or a tiled shuffle modelled on the
// ROCm/AITER weight pre-shuffle that GEMM kernels expect.
//
// The shuffle is a permutation of a tensor's bytes, so unshuffle() undoes it exactly, and it is
// NOT idempotent: shuffle(shuffle(w)) != shuffle(w). That is deliberate. It is what made the
// real double-shuffle bug silent (a second pass yields a valid-looking but wrong layout), and
// engines here must be shown to never apply it twice to one load.
//
// The rule. A tensor of shape s and element size e (1, 2, 4 or 8 bytes) is viewed as a
// row-major matrix [R, C]: rank >= 2 -> R = prod(s[:-1]), C = s[-1]; rank 1 -> [1, s[0]];
// rank 0 -> [1, 1]. A tile is kTileRows (16) rows x kTileRowBytes (64) bytes: AITER's (16, 16)
// layout for bf16 (16 rows x 32 elements), kept at the same byte width for every element size
// (64 / e elements) so every dtype gets the same permutation. A tile row is four 16-byte lane
// groups (16 / e elements each, kept in order). Within its own footprint a tile is rewritten
// column-block-major with a skew: counting footprint groups row by row (four per row), position
// p = g * 16 + (r + g) % 16 holds group g of row r, i.e. the 16 x 4 grid of groups is transposed
// and column g is rotated by g rows (a skewed transpose, as bank-conflict-free layouts do).
// That is neither idempotent nor an involution: shuffle twice is neither shuffle once nor the
// original.
//
// Order. As a permutation of a tile's 64 groups the shuffle has order 1806 (cycles of lengths
// 1, 2, 3, 7, 43 and their multiples): applied n times it equals applying it once only when
// n = 1 (mod 1806). So a tensor shuffled k extra times reads wrong for every k from 1 to 1805,
// which is what a demo of the double-shuffle bug needs (the plain transpose used before had
// order 3: a fourth application brought the tensor back). tests/sync/data/layout_test.cc checks
// the order against the reference.
// Only full tiles move. The last R % 16 rows and the last (C * e) % 64 bytes of every row stay
// in place. Hence the tensors left unchanged are exactly those with no full tile: R < 16 or
// C * e < 64, which includes every rank-0 and rank-1 tensor (norms, biases; AITER does not
// shuffle those either). Every other tensor is changed unless its data repeats along the
// permutation's cycles (random data never does).
//
// Speed: one pass over the tensor, a 1 KiB tile at a time through a stack buffer, with 16-byte
// group copies; no allocation.
// Lifetime/threading: pure functions on caller-owned memory; safe from any thread on disjoint
// buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sync/protocol/tensor.h"

namespace weightcast::sync {

enum class Layout { kNone, kShuffle };

// "none", "shuffle" (exact). Anything else throws comm::BadRequestError quoting the value.
Layout parse_layout(std::string_view text);
std::string_view to_string(Layout layout);

inline constexpr std::size_t kTileRows = 16;
inline constexpr std::size_t kTileRowBytes = 64;
inline constexpr std::size_t kLaneGroupBytes = 16;

// Whether shuffle() moves any byte of a tensor of this shape and element size: at least one
// full tile.
bool shuffle_moves(std::span<const std::int64_t> shape, std::size_t element_size);

// In place. `bytes.size()` must equal numel(shape) * element_size, and element_size must be
// 1, 2, 4 or 8 (EnforceError otherwise).
void shuffle_in_place(std::span<std::byte> bytes, std::size_t element_size,
                      std::span<const std::int64_t> shape);
void unshuffle_in_place(std::span<std::byte> bytes, std::size_t element_size,
                        std::span<const std::int64_t> shape);

// Copying variants: `dst` receives the transformed `src`; same size rules, and the spans must
// be equal in size. `dst` may be `src` itself but must not partially overlap it.
void shuffle_copy(std::span<const std::byte> src, std::span<std::byte> dst,
                  std::size_t element_size, std::span<const std::int64_t> shape);
void unshuffle_copy(std::span<const std::byte> src, std::span<std::byte> dst,
                    std::size_t element_size, std::span<const std::int64_t> shape);

// The post-load transform of `layout` applied to one tensor's bytes in place (kNone: nothing).
void apply_layout(Layout layout, const TensorMeta& meta, std::span<std::byte> bytes);
// The inverse, e.g. to compare a runner's resident bytes with what was sent.
void undo_layout(Layout layout, const TensorMeta& meta, std::span<std::byte> bytes);

}  // namespace weightcast::sync
