#include "sync/protocol/protocol_text.h"

#include <gtest/gtest.h>

#include <string>

namespace weightcast::sync {
namespace {

constexpr std::size_t npos = std::string_view::npos;

TEST(ProtocolUtf8, WellFormed) {
  for (const std::string& ok :
       {std::string(), std::string("ascii"), std::string("caf\xc3\xa9"),
        std::string("\xe2\x82\xac"), std::string("\xf0\x9f\x98\x80"), std::string("\xef\xbf\xbf"),
        std::string("\xf4\x8f\xbf\xbf"), std::string("nul\0inside", 10)}) {
    EXPECT_EQ(find_invalid_utf8(ok), npos) << quoted(ok);
  }
}

TEST(ProtocolUtf8, IllFormedReportsOffset) {
  const struct {
    std::string text;
    std::size_t offset;
  } bad[] = {
      {"ab\x80", 2},            // lone continuation byte
      {"\xc0\xaf", 0},          // overlong '/'
      {"\xc1\xbf", 0},          // overlong
      {"x\xe0\x80\xaf", 1},     // overlong 3-byte
      {"\xed\xa0\x80", 0},      // UTF-16 surrogate
      {"\xf0\x80\x80\xaf", 0},  // overlong 4-byte
      {"\xf4\x90\x80\x80", 0},  // above U+10FFFF
      {"\xf5\x80\x80\x80", 0},  // invalid lead byte
      {"\xff", 0},              // invalid lead byte
      {"ok\xc3", 2},            // truncated 2-byte
      {"ok\xe2\x82", 2},        // truncated 3-byte
      {"\xe2\x28\xa1", 0},      // bad continuation
      {"\xf0\x9f\x98\x28", 0},  // bad last continuation
  };
  for (const auto& b : bad) EXPECT_EQ(find_invalid_utf8(b.text), b.offset) << quoted(b.text);
}

TEST(ProtocolQuoted, EscapesAndBounds) {
  EXPECT_EQ(quoted("abc"), "'abc'");
  EXPECT_EQ(quoted(std::string("a\nb\x1b", 4)), "'a\\x0ab\\x1b'");
  EXPECT_EQ(quoted("caf\xc3\xa9"), "'caf\\xc3\\xa9'");
  const std::string q = quoted(std::string(1000, 'x'));
  EXPECT_LT(q.size(), 80u);
  EXPECT_NE(q.find("..."), std::string::npos);
}

}  // namespace
}  // namespace weightcast::sync
