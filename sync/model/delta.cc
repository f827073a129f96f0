#include "sync/model/delta.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/errors.h"

namespace weightcast::sync {

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 20;
// Projections are trusted once this much of a bucket has been encoded.
constexpr std::size_t kProjectAfter = std::size_t{4} << 20;

[[noreturn]] void bad(const std::string& what) {
  throw comm::BadRequestError("delta payload: " + what);
}

// dst[i] = a[i] ^ b[i], 8 bytes at a time (the compiler vectorizes the loop).
void xor_into(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x;
    std::uint64_t y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x ^= y;
    std::memcpy(dst + i, &x, 8);
  }
  for (; i < n; ++i) dst[i] = a[i] ^ b[i];
}

// Whether a payload of `written` bytes after `consumed` of `total` input bytes projects to
// `limit` or more over the whole input.
bool over_limit(std::size_t written, std::size_t consumed, std::size_t total, std::size_t limit) {
  if (written >= limit) return true;
  if (consumed < kProjectAfter || consumed == 0) return false;
  const long double projected =
      static_cast<long double>(written) * static_cast<long double>(total) / consumed;
  return projected >= static_cast<long double>(limit);
}

void put_le(std::byte* at, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<std::byte>(value >> (8 * i));
}

// Makes `out` at least `need` bytes long (at most `cap`), growing geometrically: a payload is
// written as it is made, so only the bytes written are ever zero-filled by resize(), not the
// caller's limit (for a bucket of 128 MiB and a limit of 3/4 of it, that was a 96 MiB memset per
// encode, most of the encoder's time).
void grow(std::vector<std::byte>& out, std::size_t need, std::size_t cap) {
  if (out.size() >= need) return;
  out.resize(std::min(std::max(need, 2 * out.size()), std::max(cap, need)));
}

std::uint64_t get_le(const std::byte* at, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= std::uint64_t{std::to_integer<std::uint8_t>(at[i])} << (8 * i);
  return value;
}

}  // namespace

// ---- encoder ----

struct DeltaEncoder::State {
  ZSTD_CCtx* zstd = nullptr;
  std::vector<std::byte> scratch = std::vector<std::byte>(kChunk);
  ~State() { ZSTD_freeCCtx(zstd); }

  bool zstd_encode(std::span<const std::byte> next, std::span<const std::byte> base,
                   std::size_t limit, std::vector<std::byte>& out);
  bool lz4_encode(std::span<const std::byte> next, std::span<const std::byte> base,
                  std::size_t limit, std::vector<std::byte>& out);
  static bool sparse_encode(std::span<const std::byte> next, std::span<const std::byte> base,
                            std::size_t limit, std::vector<std::byte>& out);
};

bool DeltaEncoder::State::zstd_encode(std::span<const std::byte> next,
                                      std::span<const std::byte> base, std::size_t limit,
                                      std::vector<std::byte>& out) {
  if (zstd == nullptr) {
    zstd = ZSTD_createCCtx();
    WC_ENFORCE(zstd != nullptr, "ZSTD_createCCtx failed");
  }
  ZSTD_CCtx_reset(zstd, ZSTD_reset_session_only);
  ZSTD_CCtx_setParameter(zstd, ZSTD_c_compressionLevel, 1);
  ZSTD_CCtx_setPledgedSrcSize(zstd, next.size());
  const std::size_t cap = std::max<std::size_t>(limit, 1);
  out.clear();
  ZSTD_outBuffer o{nullptr, 0, 0};
  const std::size_t total = next.size();
  std::size_t done = 0;
  do {
    const std::size_t n = std::min(kChunk, total - done);
    xor_into(scratch.data(), next.data() + done, base.data() + done, n);
    done += n;
    const ZSTD_EndDirective mode = done == total ? ZSTD_e_end : ZSTD_e_continue;
    ZSTD_inBuffer in{scratch.data(), n, 0};
    for (;;) {
      grow(out, o.pos + ZSTD_compressBound(in.size - in.pos), cap);
      o.dst = out.data();
      o.size = std::min(out.size(), cap);
      const std::size_t left = ZSTD_compressStream2(zstd, &o, &in, mode);
      WC_ENFORCE(!ZSTD_isError(left), "zstd: ", ZSTD_getErrorName(left));
      if (o.pos == cap) return false;  // the payload reached the limit
      if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size) break;
    }
    if (over_limit(o.pos, done, total, limit)) return false;
  } while (done < total);
  if (o.pos >= limit) return false;
  out.resize(o.pos);
  return true;
}

bool DeltaEncoder::State::lz4_encode(std::span<const std::byte> next,
                                     std::span<const std::byte> base, std::size_t limit,
                                     std::vector<std::byte>& out) {
  const auto bound = static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(kChunk)));
  const std::size_t cap = std::max<std::size_t>(limit, 1) + bound + 4;
  out.clear();
  const std::size_t total = next.size();
  std::size_t done = 0;
  std::size_t pos = 0;
  while (done < total) {
    const std::size_t n = std::min(kChunk, total - done);
    xor_into(scratch.data(), next.data() + done, base.data() + done, n);
    done += n;
    grow(out, pos + 4 + bound, cap);
    const int size = LZ4_compress_default(reinterpret_cast<const char*>(scratch.data()),
                                          reinterpret_cast<char*>(out.data() + pos + 4),
                                          static_cast<int>(n), static_cast<int>(bound));
    WC_ENFORCE_GT(size, 0, "LZ4_compress_default failed");
    put_le(out.data() + pos, static_cast<std::uint64_t>(size), 4);
    pos += 4 + static_cast<std::size_t>(size);
    if (over_limit(pos, done, total, limit)) return false;
  }
  out.resize(pos);
  return true;
}

bool DeltaEncoder::State::sparse_encode(std::span<const std::byte> next,
                                        std::span<const std::byte> base, std::size_t limit,
                                        std::vector<std::byte>& out) {
  const std::size_t total = next.size();
  const std::size_t words = total / 2;
  WC_ENFORCE_LE(words, std::size_t{0xffffffff}, "sparse deltas index at most 2^32 words");
  const std::size_t tail = total % 2;
  const std::size_t cap = std::max<std::size_t>(limit, 1) + 8;
  out.clear();
  grow(out, std::min<std::size_t>(cap, std::size_t{64} << 10), cap);
  std::size_t pos = 8;
  std::uint64_t count = 0;
  // Writes the changed words among the (up to) 4 at word w, given as 8-byte lanes; false when
  // the payload reached the limit.
  const auto emit = [&](std::size_t w, std::uint64_t x, std::uint64_t y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const auto d = static_cast<std::uint16_t>((x ^ y) >> (16 * i));
      if (d == 0) continue;
      if (pos + 6 + tail >= limit) return false;
      grow(out, pos + 6 + tail, cap);
      put_le(out.data() + pos, w + i, 4);
      put_le(out.data() + pos + 4, d, 2);
      pos += 6;
      count += 1;
    }
    return true;
  };
  // 64 bytes (32 words) at a time: most blocks are equal and skipped with one test of 8 lanes
  // (the compiler vectorizes it); a block with a change is walked 8 bytes at a time.
  constexpr std::size_t kLanes = 8;
  std::size_t w = 0;
  for (; w + 4 * kLanes <= words; w += 4 * kLanes) {
    std::uint64_t x[kLanes];
    std::uint64_t y[kLanes];
    std::memcpy(x, next.data() + 2 * w, sizeof(x));
    std::memcpy(y, base.data() + 2 * w, sizeof(y));
    std::uint64_t any = 0;
    for (std::size_t l = 0; l < kLanes; ++l) any |= x[l] ^ y[l];
    if (any == 0) continue;
    for (std::size_t l = 0; l < kLanes; ++l) {
      if (x[l] != y[l] && !emit(w + 4 * l, x[l], y[l], 4)) return false;
    }
  }
  for (; w < words; w += 4) {
    const std::size_t n = std::min<std::size_t>(4, words - w);
    std::uint64_t x = 0;
    std::uint64_t y = 0;
    std::memcpy(&x, next.data() + 2 * w, 2 * n);
    std::memcpy(&y, base.data() + 2 * w, 2 * n);
    if (x != y && !emit(w, x, y, n)) return false;
  }
  grow(out, pos + tail, cap);
  put_le(out.data(), count, 8);
  if (tail) out[pos++] = next[total - 1] ^ base[total - 1];
  if (pos >= limit) return false;
  out.resize(pos);
  return true;
}

DeltaEncoder::DeltaEncoder(DeltaCodec codec) : codec_(codec), state_(std::make_unique<State>()) {}
DeltaEncoder::~DeltaEncoder() = default;

bool DeltaEncoder::encode(std::span<const std::byte> next, std::span<const std::byte> base,
                          std::size_t limit, std::vector<std::byte>& out) {
  WC_ENFORCE_EQ(next.size(), base.size(), "a delta needs a base of the same size");
  switch (codec_) {
    case DeltaCodec::kXorZstd:
      return state_->zstd_encode(next, base, limit, out);
    case DeltaCodec::kXorLz4:
      return state_->lz4_encode(next, base, limit, out);
    case DeltaCodec::kSparse:
      return State::sparse_encode(next, base, limit, out);
  }
  return false;
}

// ---- decoder ----

struct DeltaDecoder::State {
  ZSTD_DCtx* zstd = nullptr;
  std::vector<std::byte> scratch = std::vector<std::byte>(kChunk);
  ~State() { ZSTD_freeDCtx(zstd); }

  void zstd_decode(std::span<const std::byte> payload, std::span<std::byte> inout);
  void lz4_decode(std::span<const std::byte> payload, std::span<std::byte> inout);
  static void sparse_decode(std::span<const std::byte> payload, std::span<std::byte> inout);
};

void DeltaDecoder::State::zstd_decode(std::span<const std::byte> payload,
                                      std::span<std::byte> inout) {
  if (zstd == nullptr) {
    zstd = ZSTD_createDCtx();
    WC_ENFORCE(zstd != nullptr, "ZSTD_createDCtx failed");
  }
  ZSTD_DCtx_reset(zstd, ZSTD_reset_session_only);
  ZSTD_inBuffer in{payload.data(), payload.size(), 0};
  std::size_t done = 0;
  std::size_t left = 1;
  while (left != 0) {
    ZSTD_outBuffer o{scratch.data(), scratch.size(), 0};
    left = ZSTD_decompressStream(zstd, &o, &in);
    if (ZSTD_isError(left)) bad(std::string("zstd: ") + ZSTD_getErrorName(left));
    if (o.pos > inout.size() - done) {
      bad("decodes to more than the bucket's " + std::to_string(inout.size()) + " bytes");
    }
    xor_into(inout.data() + done, inout.data() + done, scratch.data(), o.pos);
    done += o.pos;
    if (left != 0 && o.pos == 0 && in.pos == in.size) bad("truncated zstd frame");
  }
  if (in.pos != in.size) bad("bytes after the zstd frame");
  if (done != inout.size()) {
    bad("decodes to " + std::to_string(done) + " bytes, the bucket holds " +
        std::to_string(inout.size()));
  }
}

void DeltaDecoder::State::lz4_decode(std::span<const std::byte> payload,
                                     std::span<std::byte> inout) {
  std::size_t pos = 0;
  std::size_t done = 0;
  while (done < inout.size()) {
    if (payload.size() - pos < 4) bad("truncated before chunk at byte " + std::to_string(done));
    const std::uint64_t size = get_le(payload.data() + pos, 4);
    pos += 4;
    if (size > payload.size() - pos) bad("chunk size " + std::to_string(size) + " past the end");
    const std::size_t want = std::min(kChunk, inout.size() - done);
    const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(payload.data() + pos),
                                        reinterpret_cast<char*>(scratch.data()),
                                        static_cast<int>(size), static_cast<int>(want));
    if (got < 0 || static_cast<std::size_t>(got) != want) {
      bad("chunk at byte " + std::to_string(done) + " does not decode to " + std::to_string(want) +
          " bytes");
    }
    xor_into(inout.data() + done, inout.data() + done, scratch.data(), want);
    pos += size;
    done += want;
  }
  if (pos != payload.size()) bad("bytes after the last chunk");
}

void DeltaDecoder::State::sparse_decode(std::span<const std::byte> payload,
                                        std::span<std::byte> inout) {
  const std::size_t tail = inout.size() % 2;
  if (payload.size() < 8 + tail) bad("shorter than its header");
  const std::uint64_t count = get_le(payload.data(), 8);
  const std::size_t body = payload.size() - 8 - tail;
  if (body % 6 != 0 || count != body / 6) {
    bad("count " + std::to_string(count) + " does not match " + std::to_string(payload.size()) +
        " bytes");
  }
  const std::size_t words = inout.size() / 2;
  const std::byte* at = payload.data() + 8;
  std::uint64_t previous = 0;
  for (std::uint64_t i = 0; i < count; ++i, at += 6) {
    const std::uint64_t w = get_le(at, 4);
    if (w >= words || (i > 0 && w <= previous)) {
      bad("word index " + std::to_string(w) + " out of range or order");
    }
    previous = w;
    inout[2 * w] ^= at[4];
    inout[2 * w + 1] ^= at[5];
  }
  if (tail) inout[inout.size() - 1] ^= *at;
}

DeltaDecoder::DeltaDecoder(DeltaCodec codec) : codec_(codec), state_(std::make_unique<State>()) {}
DeltaDecoder::~DeltaDecoder() = default;

void DeltaDecoder::decode(std::span<const std::byte> payload, std::span<std::byte> inout) {
  switch (codec_) {
    case DeltaCodec::kXorZstd:
      return state_->zstd_decode(payload, inout);
    case DeltaCodec::kXorLz4:
      return state_->lz4_decode(payload, inout);
    case DeltaCodec::kSparse:
      return State::sparse_decode(payload, inout);
  }
}

}  // namespace weightcast::sync
