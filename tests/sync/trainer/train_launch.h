// Starting weightcast-engine and `mpirun ... weightcast-train` from the trainer's real-process
// tests, and reading what they print. Paths come from compile definitions
// (WEIGHTCAST_ENGINE_BIN, WEIGHTCAST_TRAIN_BIN, WEIGHTCAST_MPIEXEC, WEIGHTCAST_MPIRUN_FLAGS).
// Threading: plain functions; each Subprocess has one owner thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "sync/trainer/http/engine_client.h"
#include "tests/support/subprocess.h"

namespace weightcast::sync::trainer::testing {

struct TestEngine {
  std::unique_ptr<weightcast::testing::Subprocess> process;
  std::string url;
};

// Starts the engine command line `argv` and waits for its URL.
TestEngine start_engine_process(const std::vector<std::string>& argv);

// An engine of `ranks` ranks (tests/support/engine_launch.h), `extra` flags appended; waits for
// its URL. `port` 0: an ephemeral one; else that port (a restart on the port the engine's
// previous process bound).
TestEngine start_engine(int ranks, const std::vector<std::string>& extra = {}, int seed = 5,
                        int port = 0);

// `mpirun -np <np> weightcast-train --model tiny --seed 5 --engines <urls> <args>`, stderr
// folded into stdout so a test sees the error lines too.
std::unique_ptr<weightcast::testing::Subprocess> start_trainer(
    int np, const std::vector<std::string>& urls, const std::vector<std::string>& args);

// `mpirun -np 4 weightcast-train --tp 2 --pp 2 --engines <the engines' URLs> <extra>`, as above.
std::unique_ptr<weightcast::testing::Subprocess> start_trainer(
    const std::vector<TestEngine>& engines, std::vector<std::string> extra);

// A client with short timeouts, for checking an engine from the test.
EngineClient test_client(const std::string& url);

int count_matches(const std::string& text, const std::string& pattern);

// `text` with the regex metacharacters of a URL escaped.
std::string regex_escape(const std::string& text);

}  // namespace weightcast::sync::trainer::testing
