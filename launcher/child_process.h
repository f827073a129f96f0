// ChildProcess: a process a launcher starts (engines, bench workers), its stdout read line by
// line with a deadline, stderr passed through. The destructor stops (SIGTERM, then SIGKILL after
// a grace period) and reaps a child that is still running, so a failing run leaves nothing
// behind. Threading: one owner thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace weightcast::launcher {

class ChildProcess {
 public:
  // Starts argv[0] (a path, or a name looked up in PATH) with the rest as arguments.
  explicit ChildProcess(std::vector<std::string> argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  // The next stdout line (without '\n') within `timeout`; throws std::runtime_error naming
  // `what` when none comes in time or the child closed its stdout.
  std::string line(std::chrono::milliseconds timeout, const std::string& what);
  // Reads lines until one starts with `prefix` and returns it, as line() does.
  std::string line_starting(const std::string& prefix, std::chrono::milliseconds timeout,
                            const std::string& what);

  // Waits for the exit (bounded by `timeout`, then SIGKILL) and returns the exit code, or
  // 128 + signal.
  int wait_exit(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_;
};

}  // namespace weightcast::launcher
