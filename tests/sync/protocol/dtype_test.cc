#include "sync/protocol/dtype.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "comm/errors.h"
#include "tests/support/names.h"

namespace weightcast::sync {
namespace {

struct Row {
  const char* name;
  DType dtype;
  std::size_t size;
};

// Names and sizes as torch reports them: str(torch.d) without "torch." and d.itemsize.
constexpr Row kTable[] = {
    {"float32", DType::kFloat32, 4},
    {"float16", DType::kFloat16, 2},
    {"bfloat16", DType::kBFloat16, 2},
    {"float64", DType::kFloat64, 8},
    {"float8_e4m3fn", DType::kFloat8E4M3Fn, 1},
    {"float8_e5m2", DType::kFloat8E5M2, 1},
    {"int8", DType::kInt8, 1},
    {"uint8", DType::kUInt8, 1},
    {"int16", DType::kInt16, 2},
    {"int32", DType::kInt32, 4},
    {"int64", DType::kInt64, 8},
    {"bool", DType::kBool, 1},
};

TEST(DType, TableOfNamesAndSizes) {
  ASSERT_EQ(all_dtypes().size(), std::size(kTable));
  for (const Row& row : kTable) {
    EXPECT_EQ(parse_dtype(row.name), row.dtype) << row.name;
    EXPECT_EQ(parse_dtype(std::string("torch.") + row.name), row.dtype) << row.name;
    EXPECT_EQ(to_string(row.dtype), row.name);
    EXPECT_EQ(element_size(row.dtype), row.size) << row.name;
  }
}

TEST(DType, AllDTypesAreDistinctAndRoundTrip) {
  std::set<std::string_view> names;
  for (DType d : all_dtypes()) {
    EXPECT_TRUE(names.insert(to_string(d)).second) << to_string(d);
    EXPECT_EQ(parse_dtype(to_string(d)), d);
  }
}

TEST(DType, TorchAliasesResolveToCanonicalNames) {
  const struct {
    const char* alias;
    const char* canonical;
  } aliases[] = {{"half", "float16"},       {"float", "float32"},   {"double", "float64"},
                 {"short", "int16"},        {"int", "int32"},       {"long", "int64"},
                 {"torch.half", "float16"}, {"torch.long", "int64"}};
  for (const auto& a : aliases) EXPECT_EQ(to_string(parse_dtype(a.alias)), a.canonical) << a.alias;
}

TEST(DType, UnknownIsBadRequestNamingTheValue) {
  // The message lists the valid names, bfloat16 among them.
  testing::expect_refusals_name_the_value(
      parse_dtype,
      {"", "torch.", "BFloat16", "bf16", "fp8", "float8_e4m3fnuz", "complex64",
       "torch.torch.float32", "float32 ", "uint16x"},
      "bfloat16");
}

TEST(DType, InvalidEnumValueIsMisuse) {
  EXPECT_THROW(element_size(static_cast<DType>(99)), comm::EnforceError);
  EXPECT_THROW(to_string(static_cast<DType>(-1)), comm::EnforceError);
}

}  // namespace
}  // namespace weightcast::sync
