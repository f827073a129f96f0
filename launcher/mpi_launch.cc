#include "launcher/mpi_launch.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

namespace weightcast::launcher {

bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

std::vector<std::string> mpirun_argv(int np, const std::vector<std::string>& argv,
                                     const std::vector<std::string>& mca) {
  std::map<std::string, std::string> overrides;
  for (const auto& kv : mca) {
    auto eq = kv.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("mca override needs NAME=VALUE: " + kv);
    overrides[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  std::vector<std::string> args{"mpirun"};
  const char* env_flags = std::getenv("WEIGHTCAST_MPIRUN_FLAGS");
  std::istringstream flags(env_flags ? env_flags : WEIGHTCAST_DEFAULT_MPIRUN_FLAGS);
  std::vector<std::string> given;
  for (std::string f; flags >> f;) given.push_back(f);
  for (std::size_t i = 0; i < given.size(); ++i) {
    if (given[i] == "--mca" && i + 2 < given.size() && overrides.count(given[i + 1])) {
      i += 2;  // replaced below
      continue;
    }
    args.push_back(given[i]);
  }
  for (const auto& [name, value] : overrides) {
    args.insert(args.end(), {"--mca", name, value});
  }
  args.push_back("-np");
  args.push_back(std::to_string(np));
  // The executable itself, by absolute path, so mpirun finds it regardless of PATH.
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  args.push_back(n > 0 ? std::string(self, static_cast<std::size_t>(n)) : argv.at(0));
  for (std::size_t i = 1; i < argv.size(); ++i) args.push_back(argv[i]);
  return args;
}

void relaunch_under_mpirun(int np, const std::vector<std::string>& argv,
                           const std::vector<std::string>& mca) {
  std::vector<std::string> args = mpirun_argv(np, argv, mca);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execvp("mpirun", cargs.data());
  throw std::runtime_error(std::string("cannot run mpirun: ") + std::strerror(errno) +
                           " (install openmpi-bin, or launch with mpirun yourself)");
}

}  // namespace weightcast::launcher
