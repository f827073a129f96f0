// NetnsTopology: a private network of Linux network namespaces for multi-host tests — one
// "switch" namespace holding a bridge, and N host namespaces, each joined to the bridge by a veth
// pair, with addresses from 198.18.0.0/15 (the range reserved for network benchmarking). Taking
// a host's switch port down is a cable cut: the host keeps its address and its local sockets,
// but nothing crosses the link, and no peer is told (no RST, no FIN).
//
// Names carry the test process's pid, so concurrent runs never collide and leftovers of a dead
// run are recognised (and removed) by the next one.
// Lifetime: the constructor builds everything or throws, removing what it built; the destructor
// kills whatever still runs inside the namespaces and deletes them. A guardian process, in a
// session of its own so that a signal to the test's process group does not reach it, does the
// same cleanup if the test process dies without running the destructor (SIGKILL at a ctest
// timeout): it waits for EOF on a pipe whose only writer is the test process.
// Threading: construct, set_link and destroy from one thread; enter_namespace() and
// run_in_namespace() from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/non_copyable.h"

namespace weightcast::testing {

// Why network namespaces cannot be used here (not root, no CAP_NET_ADMIN, no ip(8)), or nullopt
// when they can. Probes by creating and deleting a namespace.
std::optional<std::string> netns_unavailable_reason();

class NetnsTopology : comm::NonCopyable {
 public:
  // `hosts` host namespaces; host i has address host_address(i) on its interface "eth0".
  // Throws std::runtime_error naming the command that failed.
  explicit NetnsTopology(int hosts);
  ~NetnsTopology();

  int hosts() const { return static_cast<int>(hosts_.size()); }
  const std::string& host_namespace(int host) const;
  std::string host_address(int host) const;

  // Sets host `host`'s port on the switch down (a cut) or up (restored). Throws on failure.
  void set_link(int host, bool up);

  // argv that runs `argv` inside host `host`'s namespace (ip netns exec, which execs in place:
  // the process started from it is the program itself, so signals reach it directly).
  std::vector<std::string> exec_argv(int host, std::vector<std::string> argv) const;

 private:
  void build();
  void destroy();
  void start_guardian();

  std::string prefix_;
  std::string switch_ns_;
  std::vector<std::string> hosts_;
  pid_t guardian_ = -1;
  int guardian_fd_ = -1;  // write end of the guardian's pipe
};

// Moves the calling thread into network namespace `ns`: sockets it opens from then on live
// there. Throws std::runtime_error when the namespace cannot be entered.
void enter_namespace(const std::string& ns);

// Runs `fn` on a new thread inside namespace `ns` and waits for it; rethrows what fn threw.
void run_in_namespace(const std::string& ns, const std::function<void()>& fn);

// Runs argv (argv[0] is looked up in PATH, then in the sbin directories), output discarded,
// and returns its exit status; -1 when it cannot be started, 124 when it ran past `timeout`
// (it is then killed).
int run_command(const std::vector<std::string>& argv,
                std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace weightcast::testing
