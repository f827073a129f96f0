// Starting weightcast-engine from multi-process tests: the one argv every such test begins with
// and the wait for the engine's "listening on" line. Threading: plain functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace weightcast::testing {

// `binary` on an ephemeral port with `ranks` ranks, the tiny model generated from `seed`, a
// target and a frozen draft runner (default filters), both with the shuffle layout; `extra`
// flags are appended (a flag given twice is refused: change the ones above with set_flag_value).
std::vector<std::string> test_engine_argv(const std::string& binary, int ranks, std::uint64_t seed,
                                          const std::vector<std::string>& extra = {});

// Sets the value that follows `flag` in `argv` (the first occurrence; none: nothing changes).
void set_flag_value(std::vector<std::string>& argv, const std::string& flag,
                    const std::string& value);

// Waits for "weightcast-engine listening on http://HOST:PORT" and returns "http://HOST:PORT";
// throws std::runtime_error with the engine's output when it does not come within `timeout`.
std::string wait_for_engine_url(Subprocess& engine, std::chrono::milliseconds timeout);

// The port of "http://HOST:PORT".
int url_port(const std::string& url);

}  // namespace weightcast::testing
