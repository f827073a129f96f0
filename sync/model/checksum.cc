#include "sync/model/checksum.h"

#include <xxhash.h>

#include "weightcast/config.h"
#if WEIGHTCAST_HAVE_XXH_DISPATCH
// Replaces XXH3_128bits and XXH3_128bits_update by their run-time dispatched (AVX2 / AVX-512)
// versions: the same digests, 2-9x faster than the baseline build on x86-64.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <array>
#include <new>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

Digest from_xxh(const XXH128_hash_t& h) {
  return Digest{h.high64, h.low64};
}

std::array<std::byte, 16> canonical_bytes(const Digest& d) {
  std::array<std::byte, 16> out{};
  for (int i = 0; i < 8; ++i) {
    out[static_cast<std::size_t>(i)] = static_cast<std::byte>(d.high >> (56 - 8 * i));
    out[static_cast<std::size_t>(8 + i)] = static_cast<std::byte>(d.low >> (56 - 8 * i));
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string to_string(const Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    const std::uint64_t word = i < 8 ? digest.high : digest.low;
    const int shift = 60 - 4 * (i % 8) * 2;
    out[static_cast<std::size_t>(2 * i)] = kHex[(word >> shift) & 0xf];
    out[static_cast<std::size_t>(2 * i + 1)] = kHex[(word >> (shift - 4)) & 0xf];
  }
  return out;
}

Digest parse_digest(std::string_view text, std::string_view field) {
  Digest d;
  bool ok = text.size() == 32;
  for (std::size_t i = 0; ok && i < 32; ++i) {
    const int v = hex_value(text[i]);
    if (v < 0) {
      ok = false;
      break;
    }
    std::uint64_t& word = i < 16 ? d.high : d.low;
    word = (word << 4) | static_cast<std::uint64_t>(v);
  }
  if (!ok) {
    throw comm::BadRequestError(std::string(field) + ": expected 32 hex digits, got " +
                                sync::quoted(text));
  }
  return d;
}

Digest tensor_digest(std::span<const std::byte> bytes) {
  return from_xxh(XXH3_128bits(bytes.data(), bytes.size()));
}

struct Hasher::State {
  XXH3_state_t* xxh = nullptr;
  ~State() { XXH3_freeState(xxh); }
};

Hasher::Hasher() : state_(std::make_unique<State>()) {
  state_->xxh = XXH3_createState();
  if (state_->xxh == nullptr) throw std::bad_alloc();
  reset();
}

Hasher::~Hasher() = default;
Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;

void Hasher::update(std::span<const std::byte> bytes) {
  WC_ENFORCE(state_ != nullptr, "Hasher used after move");
  WC_ENFORCE_EQ(XXH3_128bits_update(state_->xxh, bytes.data(), bytes.size()), XXH_OK);
}

void Hasher::update(std::string_view text) {
  update(std::as_bytes(std::span(text)));
}

Digest Hasher::digest() const {
  WC_ENFORCE(state_ != nullptr, "Hasher used after move");
  return from_xxh(XXH3_128bits_digest(state_->xxh));
}

void Hasher::reset() {
  WC_ENFORCE(state_ != nullptr, "Hasher used after move");
  WC_ENFORCE_EQ(XXH3_128bits_reset(state_->xxh), XXH_OK);
}

void CombinedHasher::add(std::string_view name, const Digest& digest) {
  WC_ENFORCE(!any_ || std::string_view(last_) < name,
             name == last_ ? "duplicate tensor name " : "tensor names out of order: ", name,
             " after ", last_);
  std::array<std::byte, 8> length{};
  for (std::size_t b = 0; b < 8; ++b) {
    length[b] = static_cast<std::byte>(static_cast<std::uint64_t>(name.size()) >> (8 * b));
  }
  hasher_.update(length);
  hasher_.update(name);
  hasher_.update(canonical_bytes(digest));
  last_.assign(name);
  any_ = true;
}

Digest combined_digest(std::vector<NamedDigest> entries) {
  std::sort(entries.begin(), entries.end(),
            [](const NamedDigest& a, const NamedDigest& b) { return a.name < b.name; });
  CombinedHasher hasher;
  for (const auto& e : entries) hasher.add(e.name, e.digest);
  return hasher.digest();
}

}  // namespace weightcast::sync
