// store_tool: one rank of the multi-process store test. It connects to a TcpStore server, bumps a
// shared counter, publishes its own key, waits for every rank's key and checks their values.
//
// Usage: store_tool HOST PORT RANK WORLD [TIMEOUT_MS]   (token from WEIGHTCAST_STORE_TOKEN)
// Output on success (exit 0):
//   arrived rank=1 order=2
//   done rank=1
// On failure it prints "error: <what>" to stderr and exits 1.
#include <cstdlib>
#include <iostream>
#include <string>

#include "comm/errors.h"
#include "comm/store/tcp_store.h"

namespace {

std::string rank_key(int r) {
  return "rank/" + std::to_string(r);
}
std::string rank_value(int r) {
  return "payload-from-" + std::to_string(r);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace weightcast::comm;
  if (argc < 5) {
    std::cerr << "usage: store_tool HOST PORT RANK WORLD [TIMEOUT_MS]\n";
    return 2;
  }
  try {
    TcpStoreOptions opts;
    opts.host = argv[1];
    opts.port = static_cast<std::uint16_t>(std::stoi(argv[2]));
    const int rank = std::stoi(argv[3]);
    const int world = std::stoi(argv[4]);
    const Millis timeout(argc > 5 ? std::stoi(argv[5]) : 10000);
    if (const char* token = std::getenv("WEIGHTCAST_STORE_TOKEN")) opts.token = token;
    opts.connect_timeout = timeout;

    TcpStore store(opts);
    const auto order = store.add("arrived", 1, timeout);
    std::cout << "arrived rank=" << rank << " order=" << order << std::endl;
    store.set(rank_key(rank), rank_value(rank), timeout);
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(rank_key(r));
    store.wait(keys, timeout);
    for (int r = 0; r < world; ++r) {
      const auto got = store.get(rank_key(r), timeout);
      if (got != rank_value(r)) {
        std::cerr << "error: " << rank_key(r) << " holds '" << got << "'\n";
        return 1;
      }
    }
    const auto arrived = store.add("arrived", 0, timeout);
    if (arrived != world) {
      std::cerr << "error: counter is " << arrived << " after every rank arrived\n";
      return 1;
    }
    std::cout << "done rank=" << rank << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
