#include "launcher/malloc_tuning.h"

#include <malloc.h>

namespace weightcast::launcher {

bool tune_malloc_for_updates() {
  bool ok = mallopt(M_ARENA_MAX, 1) == 1;
  // Free memory at the top of the heap is kept up to this much, instead of being returned (and
  // faulted in again by the next update).
  ok = mallopt(M_TRIM_THRESHOLD, 512 << 20) == 1 && ok;
  // Blocks under this size come from the heap, reused from update to update, rather than from an
  // mmap of their own each time (a fixed threshold also stops glibc from moving it).
  ok = mallopt(M_MMAP_THRESHOLD, 4 << 20) == 1 && ok;
  return ok;
}

}  // namespace weightcast::launcher
