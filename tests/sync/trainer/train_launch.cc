#include "tests/sync/trainer/train_launch.h"

#include <algorithm>
#include <iterator>
#include <regex>

#include "launcher/cli_util.h"
#include "tests/support/engine_launch.h"

namespace weightcast::sync::trainer::testing {

TestEngine start_engine(int ranks, const std::vector<std::string>& extra, int seed, int port) {
  auto argv = weightcast::testing::test_engine_argv(WEIGHTCAST_ENGINE_BIN, ranks,
                                                    static_cast<std::uint64_t>(seed), extra);
  weightcast::testing::set_flag_value(argv, "--port", std::to_string(port));
  return start_engine_process(argv);
}

TestEngine start_engine_process(const std::vector<std::string>& argv) {
  TestEngine e{std::make_unique<weightcast::testing::Subprocess>(argv), ""};
  e.url = weightcast::testing::wait_for_engine_url(*e.process, std::chrono::seconds(30));
  return e;
}

std::unique_ptr<weightcast::testing::Subprocess> start_trainer(
    const std::vector<TestEngine>& engines, std::vector<std::string> extra) {
  std::vector<std::string> urls;
  for (const auto& e : engines) urls.push_back(e.url);
  extra.insert(extra.begin(), {"--tp", "2", "--pp", "2"});
  return start_trainer(4, urls, extra);
}

std::unique_ptr<weightcast::testing::Subprocess> start_trainer(
    int np, const std::vector<std::string>& urls, const std::vector<std::string>& args) {
  std::string list;
  for (const auto& url : urls) list += (list.empty() ? "" : ",") + url;
  std::string command = "exec " + std::string(WEIGHTCAST_MPIEXEC);
  // The configured flags, joined with '|' (the separator of a CMake list) and with spaces.
  for (const auto& f : weightcast::launcher::split_any(WEIGHTCAST_MPIRUN_FLAGS, "| ")) {
    command += " " + f;
  }
  // Seed 5, the test engines' own, unless the caller picks another.
  const bool seeded = std::find(args.begin(), args.end(), "--seed") != args.end();
  command += " -np " + std::to_string(np) + " " + std::string(WEIGHTCAST_TRAIN_BIN) +
             " --model tiny" + (seeded ? "" : " --seed 5") + " --engines " + list;
  for (const auto& a : args) command += " " + a;
  return std::make_unique<weightcast::testing::Subprocess>(
      std::vector<std::string>{"/bin/sh", "-c", command + " 2>&1"});
}

EngineClient test_client(const std::string& url) {
  EngineClientOptions o;
  o.connect_timeout = std::chrono::milliseconds(2000);
  o.request_timeout = std::chrono::milliseconds(10000);
  return EngineClient(url, o);
}

int count_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

std::string regex_escape(const std::string& text) {
  return std::regex_replace(text, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
}

}  // namespace weightcast::sync::trainer::testing
