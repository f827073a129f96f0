// CLI11 option wiring shared by the launchers' command lines: options whose default shows in
// --help, plain, limited to a range, or limited to a set of choices. Each returns the option, for
// further settings.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

namespace weightcast::launcher {

// An option whose default shows in --help.
template <typename T>
CLI::Option* with_default(CLI::App& app, const std::string& name, T& target,
                          const std::string& help) {
  return app.add_option(name, target, help)->capture_default_str();
}

// An option whose default shows in --help, taking values from `low` to `high` only.
template <typename T, typename Bound>
CLI::Option* ranged(CLI::App& app, const std::string& name, T& target, const std::string& help,
                    Bound low, Bound high) {
  return app.add_option(name, target, help)->check(CLI::Range(low, high))->capture_default_str();
}

// An option whose default shows in --help, taking one of `choices` only.
inline CLI::Option* one_of(CLI::App& app, const std::string& name, std::string& target,
                           const std::string& help, std::vector<std::string> choices) {
  return app.add_option(name, target, help)
      ->check(CLI::IsMember(std::move(choices)))
      ->capture_default_str();
}

}  // namespace weightcast::launcher
