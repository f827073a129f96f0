#include "tests/support/engine_launch.h"

#include <algorithm>
#include <stdexcept>

namespace weightcast::testing {

std::vector<std::string> test_engine_argv(const std::string& binary, int ranks, std::uint64_t seed,
                                          const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {binary,
                                   "--port",
                                   "0",
                                   "--ranks",
                                   std::to_string(ranks),
                                   "--model",
                                   "tiny",
                                   "--seed",
                                   std::to_string(seed),
                                   "--draft",
                                   "--target-layout",
                                   "shuffle",
                                   "--draft-layout",
                                   "shuffle"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

void set_flag_value(std::vector<std::string>& argv, const std::string& flag,
                    const std::string& value) {
  const auto at = std::find(argv.begin(), argv.end(), flag);
  if (at != argv.end() && at + 1 != argv.end()) *(at + 1) = value;
}

std::string wait_for_engine_url(Subprocess& engine, std::chrono::milliseconds timeout) {
  const auto rest = engine.wait_for_line("weightcast-engine listening on ", timeout);
  if (!rest) {
    throw std::runtime_error("engine did not start: " + engine.drain(std::chrono::seconds(1)));
  }
  return *rest;
}

int url_port(const std::string& url) {
  return std::stoi(url.substr(url.rfind(':') + 1));
}

}  // namespace weightcast::testing
