#include "sync/protocol/dtype.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "tests/support/names.h"

namespace weightcast::sync {
namespace {

// One row of data/torch_dtypes.csv: a dtype as torch names it, and its bytes per element.
struct Row {
  std::string name;
  std::size_t size = 0;
};

// The rows of the expected-values file, in DType's declaration order (the file's comment says
// where the values come from).
std::vector<Row> torch_dtypes() {
  std::ifstream in(WEIGHTCAST_TORCH_DTYPES_CSV);
  EXPECT_TRUE(in) << "cannot open " << WEIGHTCAST_TORCH_DTYPES_CSV;
  std::vector<Row> rows;
  bool header = true;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.starts_with('#')) continue;
    if (std::exchange(header, false)) {
      EXPECT_EQ(line, "name,itemsize");
      continue;
    }
    const auto comma = line.find(',');
    EXPECT_NE(comma, std::string::npos) << line;
    if (comma == std::string::npos) continue;
    rows.push_back({line.substr(0, comma), std::stoul(line.substr(comma + 1))});
  }
  return rows;
}

TEST(DType, TableOfNamesAndSizes) {
  const std::vector<Row> rows = torch_dtypes();
  ASSERT_EQ(rows.size(), all_dtypes().size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const DType dtype = all_dtypes()[i];
    EXPECT_EQ(static_cast<std::size_t>(dtype), i) << row.name;
    EXPECT_EQ(parse_dtype(row.name), dtype) << row.name;
    EXPECT_EQ(parse_dtype("torch." + row.name), dtype) << row.name;
    EXPECT_EQ(to_string(dtype), row.name);
    EXPECT_EQ(element_size(dtype), row.size) << row.name;
  }
}

TEST(DType, EnumeratorsHaveTheirTorchNames) {
  EXPECT_EQ(to_string(DType::kFloat32), "float32");
  EXPECT_EQ(to_string(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(to_string(DType::kFloat8E4M3Fn), "float8_e4m3fn");
  EXPECT_EQ(to_string(DType::kUInt8), "uint8");
  EXPECT_EQ(to_string(DType::kBool), "bool");
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
