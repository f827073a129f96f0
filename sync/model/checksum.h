// Weight checksums: XXH3-128 digests of tensors and of whole runners.
//
// tensor_digest(bytes) is XXH3-128 with seed 0, so it equals Python's
// xxhash.xxh3_128(bytes).hexdigest() and a trainer can check an engine without this library.
// A runner's digest, combined_digest(), hashes (name, tensor digest) pairs in name order, so it
// does not depend on load order but changes when a tensor is renamed, added, dropped or altered.
// Text form: 32 lower-case hex digits, high 64 bits first (XXH128's canonical form).
// Lifetime/threading: Digest is a plain value; Hasher is a movable, single-thread object.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::sync {

struct Digest {
  std::uint64_t high = 0;
  std::uint64_t low = 0;

  friend auto operator<=>(const Digest&, const Digest&) = default;
};

std::string to_string(const Digest& digest);
// Exactly 32 hex digits (either case). Anything else throws comm::BadRequestError naming
// `field` and quoting the value.
Digest parse_digest(std::string_view text, std::string_view field = "digest");

// XXH3-128 of `bytes` in one call.
Digest tensor_digest(std::span<const std::byte> bytes);

// Incremental XXH3-128: update() pieces, digest() at any time. The digest of the pieces equals
// tensor_digest() of their concatenation.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void update(std::span<const std::byte> bytes);
  void update(std::string_view text);
  Digest digest() const;
  void reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct NamedDigest {
  std::string name;
  Digest digest;

  friend bool operator==(const NamedDigest&, const NamedDigest&) = default;
};

// Digest over the entries sorted by name: for each, the name's length as 8 little-endian bytes,
// the name, then the tensor digest's 16 canonical bytes. The length prefix keeps ("ab", "c")
// apart from ("a", "bc"). Names must be unique (EnforceError otherwise). An empty list has a
// digest too (that of zero bytes).
Digest combined_digest(std::vector<NamedDigest> entries);

// combined_digest() built entry by entry from names already in order (a std::map's), without
// copying or sorting them: add() each in strictly increasing order (EnforceError otherwise,
// duplicates included), then digest(). Same result as combined_digest() of the same entries.
class CombinedHasher {
 public:
  void add(std::string_view name, const Digest& digest);
  Digest digest() const { return hasher_.digest(); }

 private:
  Hasher hasher_;
  std::string last_;
  bool any_ = false;
};

}  // namespace weightcast::sync
