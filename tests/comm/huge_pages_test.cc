// comm/huge_pages.h: the allocator hands out usable memory on both sides of its threshold and
// behaves as a std::allocator inside a vector (growth keeps the contents).
#include "comm/huge_pages.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

namespace weightcast::comm {
namespace {

void fill_and_check(std::byte* p, std::size_t bytes) {
  p[bytes - 1] = std::byte{0x5a};  // the last byte first: the stride below may overwrite it
  for (std::size_t i = 0; i < bytes; i += 4093) p[i] = static_cast<std::byte>(i & 0xff);
  for (std::size_t i = 0; i < bytes; i += 4093) {
    ASSERT_EQ(p[i], static_cast<std::byte>(i & 0xff)) << "offset " << i;
  }
  if ((bytes - 1) % 4093 != 0) {
    EXPECT_EQ(p[bytes - 1], std::byte{0x5a});
  }
}

TEST(HugePages, SmallAndLargeRequestsAreUsable) {
  for (std::size_t bytes : {std::size_t{1}, std::size_t{4096}, kHugePageBytes - 1, kHugePageBytes,
                            3 * kHugePageBytes + 12345}) {
    void* p = allocate_huge_pages(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    fill_and_check(static_cast<std::byte*>(p), bytes);
    free_huge_pages(p, bytes);
  }
  free_huge_pages(nullptr, kHugePageBytes);  // a no-op, as free(nullptr)
}

TEST(HugePages, VectorGrowthKeepsTheBytes) {
  HugePageBytes v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::byte>(i % 251);
  v.resize(5 * kHugePageBytes);  // moves from operator new memory into a mapping
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], static_cast<std::byte>(i % 251)) << i;
  EXPECT_EQ(v[5 * kHugePageBytes - 1], std::byte{0});  // value-initialized growth
  const HugePageBytes copy = v;
  EXPECT_EQ(copy, v);
  HugePageAllocator<std::uint64_t> words;
  EXPECT_TRUE(words == HugePageAllocator<std::byte>());
}

TEST(HugePages, AbsurdCountsThrowBadAlloc) {
  HugePageAllocator<std::uint64_t> words;
  EXPECT_THROW((void)words.allocate(static_cast<std::size_t>(-1) / 4), std::bad_array_new_length);
}

}  // namespace
}  // namespace weightcast::comm
