// FUZZ_CHECK: the fuzz targets' oracle. Unlike assert() it stays on in every build type (the g++
// replay runs RelWithDebInfo), prints the failed property and aborts, which libFuzzer and the
// replay driver both report as a crash with the input that caused it.
// Lifetime/threading: a macro; the targets are single-threaded.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, what)                                                                  \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   what);                                                                       \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
