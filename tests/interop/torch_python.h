// Where the interop tests find a Python interpreter that imports torch (found by CMake at
// configure time: WEIGHTCAST_TORCH_PYTHON, empty when none imports torch) and their scripts.
#pragma once

#include <string>
#include <vector>

namespace weightcast::testing {

inline std::string torch_python() {
  return WEIGHTCAST_TORCH_PYTHON;
}

inline std::string torch_missing_reason() {
  return "no Python interpreter that imports torch was found at configure time (install "
         "Debian's python3-torch: scripts/setup.sh does)";
}

inline std::string interop_script(const std::string& name) {
  return std::string(WEIGHTCAST_INTEROP_DIR) + "/" + name;
}

// torch's Gloo device binds the address of the interface named here; loopback keeps the tests
// on this machine.
inline std::vector<std::string> torch_env() {
  return {"GLOO_SOCKET_IFNAME=lo"};
}

}  // namespace weightcast::testing
