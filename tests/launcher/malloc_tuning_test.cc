// launcher/malloc_tuning.h: after tune_malloc_for_updates(), threads that allocate at the same time
// share one arena (glibc's malloc_info lists one heap), where the defaults give them several.
// Each test runs in a process of its own (ctest), so no thread exists before the call.
#include "launcher/malloc_tuning.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace weightcast::launcher {
namespace {

// The number of arenas ("<heap nr=...>" entries) malloc_info reports.
int arenas() {
  char* text = nullptr;
  std::size_t size = 0;
  std::FILE* out = open_memstream(&text, &size);
  EXPECT_NE(out, nullptr);
  malloc_info(0, out);
  std::fclose(out);
  const std::string xml(text, size);
  std::free(text);
  const std::regex heap("<heap nr=\"[0-9]+\">");
  return static_cast<int>(
      std::distance(std::sregex_iterator(xml.begin(), xml.end(), heap), std::sregex_iterator()));
}

// `threads` threads each allocate while all of them are alive, so none can reuse another's
// arena by finding it free.
void allocate_together(int threads) {
  std::barrier meet(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&meet] {
      std::vector<void*> held;
      for (int i = 0; i < 64; ++i) held.push_back(std::malloc(1024));
      meet.arrive_and_wait();
      for (void* p : held) std::free(p);
    });
  }
  for (auto& w : workers) w.join();
}

TEST(MallocTuning, ThreadsShareOneArena) {
  ASSERT_TRUE(tune_malloc_for_updates());
  allocate_together(4);
  EXPECT_EQ(arenas(), 1);
}

// The control: without the call, the same threads get arenas of their own (so the test above
// can fail).
TEST(MallocTuning, DefaultsGiveThreadsArenasOfTheirOwn) {
  allocate_together(4);
  EXPECT_GT(arenas(), 1);
}

}  // namespace
}  // namespace weightcast::launcher
