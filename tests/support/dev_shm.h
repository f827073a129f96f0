// What tests count in /dev/shm to show that nothing of theirs is left there.
// Threading: free functions.
#pragma once

#include <dirent.h>

#include <set>
#include <string>
#include <string_view>

namespace weightcast::testing {

// Whether a name in /dev/shm may be another test's, made while this one runs beside it under
// ctest -j: Python's multiprocessing semaphores ("sem.*") and torch's shared tensors ("torch_*"),
// kinds weightcast never creates; and "." / "..".
inline bool others_shm_name(std::string_view name) {
  return name.starts_with('.') || name.starts_with("sem.") || name.starts_with("torch_");
}

// The names in /dev/shm, but others_shm_name() ones.
inline std::set<std::string> dev_shm_names() {
  std::set<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir)) {
      if (!others_shm_name(entry->d_name)) names.insert(entry->d_name);
    }
    ::closedir(dir);
  }
  return names;
}

}  // namespace weightcast::testing
