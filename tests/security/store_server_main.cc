// store_server: a TcpStoreServer as its own process, for the security tests that attack the
// store port with raw bytes and watch the process (crash, memory, still serving) from outside.
//
// Usage: store_server [--bind ADDR] [--token T] [--io-timeout-ms N] [--max-value-bytes N]
// Prints "store listening on ADDR:PORT" once it accepts connections, then serves until SIGTERM or
// SIGINT (exit 0). Exit 2 on bad arguments or when it cannot bind.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/errors.h"
#include "comm/stop_signals.h"
#include "comm/store/tcp_store.h"

int main(int argc, char** argv) {
  weightcast::comm::TcpStoreServerOptions opts;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--bind") {
      opts.bind_address = value;
    } else if (flag == "--token") {
      opts.token = value;
    } else if (flag == "--io-timeout-ms") {
      opts.io_timeout = weightcast::comm::Millis(std::stoll(value));
    } else if (flag == "--max-value-bytes") {
      opts.max_value_bytes = std::stoull(value);
    } else {
      std::fprintf(stderr, "store_server: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "store_server: every flag takes a value\n");
    return 2;
  }
  const sigset_t signals = weightcast::comm::block_stop_signals();
  try {
    weightcast::comm::TcpStoreServer server(opts);
    std::printf("store listening on %s:%u\n", server.host().c_str(), unsigned{server.port()});
    std::fflush(stdout);
    int sig = 0;
    sigwait(&signals, &sig);
    server.stop();
  } catch (const weightcast::comm::Error& e) {
    std::fprintf(stderr, "store_server: %s\n", e.what());
    return 2;
  }
  return 0;
}
