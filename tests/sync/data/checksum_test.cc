#include "sync/model/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span(s));
}

TEST(Digest, MatchesPublishedXxh3Vectors) {
  // XXH3-128 of the empty input (seed 0) as published with xxHash; this also pins the text
  // form to the canonical order (high 64 bits first) that Python's hexdigest() prints.
  EXPECT_EQ(to_string(tensor_digest({})), "99aa06d3014798d86001c324468d497f");
}

TEST(Digest, RegressionValues) {
  // Computed once with this library and checked in: a change here breaks the comparison of
  // checksums between versions.
  EXPECT_EQ(to_string(tensor_digest(bytes_of("weightcast"))), "941234697ab003669e54a0eb88dfb1a3");
  std::vector<std::byte> ramp(1000);
  for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<std::byte>(i * 7);
  EXPECT_EQ(to_string(tensor_digest(ramp)), "abee229cdadad76d10ad30264426c830");
}

TEST(Digest, TextRoundTrip) {
  const Digest d{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(to_string(d), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(parse_digest(to_string(d)), d);
  EXPECT_EQ(parse_digest("0123456789ABCDEFFEDCBA9876543210"), d);
  EXPECT_EQ(to_string(Digest{}), std::string(32, '0'));
  EXPECT_THROW(parse_digest("0123"), comm::BadRequestError);
  EXPECT_THROW(parse_digest(std::string(31, '0') + "g"), comm::BadRequestError);
  EXPECT_THROW(parse_digest(std::string(33, '0')), comm::BadRequestError);
  try {
    parse_digest("xyz", "checksums.target");
    FAIL() << "no throw";
  } catch (const comm::BadRequestError& e) {
    EXPECT_NE(std::string(e.what()).find("checksums.target"), std::string::npos) << e.what();
  }
}

TEST(Hasher, PiecesEqualOneShot) {
  std::mt19937 rng(11);
  std::vector<std::byte> data(100000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  Hasher h;
  std::size_t pos = 0;
  while (pos < data.size()) {
    const std::size_t n = std::min<std::size_t>(rng() % 5000, data.size() - pos);
    h.update(std::span(data).subspan(pos, n));
    pos += n;
  }
  EXPECT_EQ(h.digest(), tensor_digest(data));
  Hasher moved = std::move(h);
  EXPECT_EQ(moved.digest(), tensor_digest(data));
  moved.reset();
  moved.update(std::string_view("weightcast"));
  EXPECT_EQ(moved.digest(), tensor_digest(bytes_of("weightcast")));
}

std::vector<NamedDigest> sample() {
  return {{"model.norm.weight", tensor_digest(bytes_of("a"))},
          {"lm_head.weight", tensor_digest(bytes_of("b"))},
          {"model.embed_tokens.weight", tensor_digest(bytes_of("c"))}};
}

TEST(CombinedDigest, IndependentOfOrder) {
  auto entries = sample();
  const Digest d = combined_digest(entries);
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.name > b.name; });
  EXPECT_EQ(combined_digest(entries), d);
  std::rotate(entries.begin(), entries.begin() + 1, entries.end());
  EXPECT_EQ(combined_digest(entries), d);
  EXPECT_EQ(to_string(d), "f8e1e7252fe30b7c37db9ca1b74e7049");
}

TEST(CombinedDigest, SensitiveToNamesDigestsAndMembership) {
  const Digest base = combined_digest(sample());
  auto renamed = sample();
  renamed[0].name = "model.norm.bias";
  EXPECT_NE(combined_digest(renamed), base);
  auto swapped = sample();  // same names and digests, paired differently
  std::swap(swapped[0].digest, swapped[1].digest);
  EXPECT_NE(combined_digest(swapped), base);
  auto altered = sample();
  altered[2].digest.low ^= 1;
  EXPECT_NE(combined_digest(altered), base);
  auto dropped = sample();
  dropped.pop_back();
  EXPECT_NE(combined_digest(dropped), base);
  EXPECT_NE(combined_digest({}), base);
  EXPECT_EQ(combined_digest({}), tensor_digest({}));
}

TEST(CombinedDigest, RejectsDuplicateNames) {
  auto entries = sample();
  entries.push_back(entries.front());
  EXPECT_THROW(combined_digest(entries), comm::EnforceError);
}

TEST(CombinedHasher, InOrderEntriesGiveCombinedDigest) {
  auto entries = sample();
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  CombinedHasher hasher;
  for (const auto& e : entries) hasher.add(e.name, e.digest);
  EXPECT_EQ(hasher.digest(), combined_digest(sample()));
  EXPECT_EQ(CombinedHasher().digest(), combined_digest({}));
  // Out of order and duplicates are misuse: the caller's order is the digest's.
  CombinedHasher backwards;
  backwards.add(entries[1].name, entries[1].digest);
  EXPECT_THROW(backwards.add(entries[0].name, entries[0].digest), comm::EnforceError);
  CombinedHasher twice;
  twice.add(entries[0].name, entries[0].digest);
  EXPECT_THROW(twice.add(entries[0].name, entries[0].digest), comm::EnforceError);
}

}  // namespace
}  // namespace weightcast::sync
