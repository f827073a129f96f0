#include "sync/protocol/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "comm/errors.h"
#include "tests/sync/protocol/bad_request.h"

namespace weightcast::sync {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

TEST(TensorMeta, NumelAndByteCount) {
  const struct {
    DType dtype;
    std::vector<std::int64_t> shape;
    std::int64_t numel;
    std::size_t bytes;
  } cases[] = {
      {DType::kBFloat16, {}, 1, 2},
      {DType::kFloat32, {0}, 0, 0},
      {DType::kFloat32, {4096, 0, 7}, 0, 0},
      {DType::kBFloat16, {151936, 4096}, 622329856, 1244659712},
      {DType::kFloat8E4M3Fn, {3, 5, 7}, 105, 105},
      {DType::kInt64, {2, 3}, 6, 48},
      {DType::kBool, {9}, 9, 9},
  };
  for (const auto& c : cases) {
    const TensorMeta t{"w", c.dtype, c.shape};
    EXPECT_EQ(t.numel(), c.numel);
    EXPECT_EQ(t.byte_count(), c.bytes);
    EXPECT_NO_THROW(validate(t));
  }
}

TEST(TensorMeta, NegativeDimensionNamesTensorAndIndex) {
  const TensorMeta t{"model.embed_tokens.weight", DType::kFloat16, {4, -2}};
  const std::string what = bad_request([&] { (void)t.numel(); });
  EXPECT_NE(what.find("model.embed_tokens.weight"), std::string::npos) << what;
  EXPECT_NE(what.find("[1]: must be >= 0 (got -2)"), std::string::npos) << what;
  EXPECT_THROW((void)t.byte_count(), comm::BadRequestError);
}

TEST(TensorMeta, NegativeDimensionReportedEvenAfterZero) {
  const std::string what = bad_request([] {
    (void)checked_numel(std::vector<std::int64_t>{0, -1}, "shapes[3]");
  });
  EXPECT_NE(what.find("shapes[3][1]: must be >= 0 (got -1)"), std::string::npos) << what;
}

TEST(TensorMeta, NumelOverflowOfInt64) {
  // 2^32 * 2^31 = 2^63 overflows; 2^32 * (2^31 - 1) does not.
  EXPECT_EQ(checked_numel(
                std::vector<std::int64_t>{std::int64_t{1} << 32, (std::int64_t{1} << 31) - 1}, "s"),
            kMax - ((std::int64_t{1} << 32) - 1));
  const std::string what = bad_request([] {
    (void)checked_numel(std::vector<std::int64_t>{std::int64_t{1} << 32, std::int64_t{1} << 31},
                        "shapes[0]");
  });
  EXPECT_NE(what.find("shapes[0]"), std::string::npos) << what;
  EXPECT_NE(what.find("overflows"), std::string::npos) << what;
  EXPECT_EQ(checked_numel(std::vector<std::int64_t>{kMax}, "s"), kMax);
  EXPECT_THROW((void)checked_numel(std::vector<std::int64_t>{kMax, 2}, "s"), comm::BadRequestError);
}

TEST(TensorMeta, ByteCountOverflow) {
  // numel fits in int64 but numel * element_size does not.
  const TensorMeta big{"big", DType::kFloat32, {std::int64_t{1} << 62}};
  EXPECT_EQ(big.numel(), std::int64_t{1} << 62);
  const std::string what = bad_request([&] { (void)big.byte_count(); });
  EXPECT_NE(what.find("'big'"), std::string::npos) << what;
  EXPECT_NE(what.find("overflows"), std::string::npos) << what;
  // The largest one-byte tensor is still representable.
  EXPECT_EQ(checked_byte_count(DType::kUInt8, std::vector<std::int64_t>{kMax}, "s"),
            static_cast<std::size_t>(kMax));
  EXPECT_THROW(
      (void)checked_byte_count(DType::kFloat16, std::vector<std::int64_t>{kMax / 2 + 1}, "s"),
      comm::BadRequestError);
}

TEST(TensorMeta, RankLimit) {
  std::vector<std::int64_t> shape(kMaxShapeRank, 1);
  EXPECT_EQ(checked_numel(shape, "s"), 1);
  shape.push_back(1);
  EXPECT_THROW((void)checked_numel(shape, "s"), comm::BadRequestError);
}

TEST(TensorMeta, NameValidation) {
  EXPECT_NO_THROW(validate_tensor_name("model.layers.0.mlp.experts.17.w1.weight", "name"));
  EXPECT_NO_THROW(validate_tensor_name(std::string(kDefaultMaxNameLength, 'a'), "name"));
  const struct {
    std::string name;
    const char* problem;
  } bad[] = {
      {"", "must not be empty"},
      {std::string(kDefaultMaxNameLength + 1, 'a'), "longer than the limit"},
      {"has space", "printable ASCII"},
      {"tab\tname", "printable ASCII"},
      {std::string("nul\0x", 5), "printable ASCII"},
      {"caf\xc3\xa9", "printable ASCII"},
      {"del\x7f", "printable ASCII"},
  };
  for (const auto& b : bad) {
    const std::string what = bad_request([&] { validate_tensor_name(b.name, "names[4]"); });
    EXPECT_EQ(what.rfind("names[4]: ", 0), 0u) << what;
    EXPECT_NE(what.find(b.problem), std::string::npos) << what;
  }
  EXPECT_THROW(validate_tensor_name("abcdef", "n", 5), comm::BadRequestError);
  EXPECT_THROW(validate(TensorMeta{"", DType::kBool, {1}}), comm::BadRequestError);
  EXPECT_THROW(validate(TensorMeta{"ok", DType::kBool, {-1}}), comm::BadRequestError);
}

}  // namespace
}  // namespace weightcast::sync
