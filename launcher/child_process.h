// ChildProcess: a process that a launcher or a multi-process test starts (engines, bench workers,
// trainers under mpirun, peer scripts), with its stdout read line by line under a deadline and
// its stderr passed through. It is the one way this project starts a child: weightcast-bench and
// the tests (tests/support/subprocess.h) share it.
//
// Stopping: the destructor stops a child still running and reaps it, so a failing run leaves
// nothing behind: SIGTERM, then SIGKILL once `stop_grace` has passed (zero: SIGKILL at once).
// With `own_group` the child leads its own process group and every signal goes to the group, so
// helpers it started go too; without it the child stays in ours, so a terminal's Ctrl-C reaches
// it as well (what a launcher wants). Every wait is bounded.
// Threading: one owner thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace weightcast::launcher {

struct ChildOptions {
  std::vector<std::string> extra_env;  // "NAME=value", added to this process's environment
  bool own_group = false;
  std::chrono::milliseconds stop_grace{5000};
  // The kernel SIGKILLs the child when the thread that started it ends, which includes this
  // process being killed by a signal that skips the destructor (PR_SET_PDEATHSIG). Only for
  // children started from a thread that outlives them, such as main().
  bool die_with_parent = false;
};

class ChildProcess {
 public:
  // Starts argv[0] (a path, or a name looked up in PATH) with the rest as arguments.
  explicit ChildProcess(std::vector<std::string> argv, ChildOptions options = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;

  pid_t pid() const { return pid_; }

  // The next stdout line (without '\n'; a last line without one at EOF), or nullopt at EOF or
  // when `timeout` passes.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix`; returns the rest of that line (nullopt as
  // read_line()).
  std::optional<std::string> wait_for_line(const std::string& prefix,
                                           std::chrono::milliseconds timeout);

  // As read_line() and wait_for_line() (the latter returning the whole line), but throw
  // std::runtime_error naming `what` when no line comes in time or the child closed its stdout.
  std::string line(std::chrono::milliseconds timeout, const std::string& what);
  std::string line_starting(const std::string& prefix, std::chrono::milliseconds timeout,
                            const std::string& what);

  // Everything read from stdout so far, including lines already returned.
  const std::string& output() const { return all_output_; }
  // Reads the rest of stdout until EOF or `timeout` and returns all output.
  std::string drain(std::chrono::milliseconds timeout);

  // Sends `sig` to the child (its group with own_group) while it runs.
  void signal(int sig);

  // Waits for the exit within `timeout`; returns the exit code (128 + signal when killed), or
  // nullopt when it is still running.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // As wait(), but a child still running at the deadline is killed: always an exit code (137
  // when even the kill could not be confirmed).
  int wait_exit(std::chrono::milliseconds timeout);
  bool running();

 private:
  void kill_now(int sig);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  ChildOptions options_;
  std::optional<int> exit_code_;
  std::string pending_;
  std::string all_output_;
};

}  // namespace weightcast::launcher
