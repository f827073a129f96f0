// Subprocess: the children of multi-process tests, started with the project's one ChildProcess
// (launcher/child_process.h) under the settings tests need: each child leads its own process
// group and is SIGKILLed with the whole group when its owner goes, so a failing test never leaves
// processes behind (mpirun's ranks, a shell's python) and never waits on a child that ignores
// SIGTERM. Threading: one owner thread.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "launcher/child_process.h"

namespace weightcast::testing {

class Subprocess : public launcher::ChildProcess {
 public:
  // Starts argv[0] (a path) with the given arguments; extra_env entries are "NAME=value".
  explicit Subprocess(std::vector<std::string> argv, std::vector<std::string> extra_env = {})
      : ChildProcess(std::move(argv), {std::move(extra_env), /*own_group=*/true,
                                       /*stop_grace=*/std::chrono::milliseconds(0)}) {}
};

}  // namespace weightcast::testing
