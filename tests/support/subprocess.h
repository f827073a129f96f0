// Subprocess: a child process for multi-process tests (fork/exec), with its stdout readable
// line by line and its stderr passed through. The destructor SIGKILLs and reaps a child that is
// still running, so a failing test never leaves processes behind.
// Threading: one owner thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace weightcast::testing {

class Subprocess {
 public:
  // Starts argv[0] (a path) with the given arguments; extra_env entries are "NAME=value".
  explicit Subprocess(std::vector<std::string> argv, std::vector<std::string> extra_env = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;

  pid_t pid() const { return pid_; }

  // Next line of the child's stdout (without '\n'), or nullopt at EOF or when timeout passes.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);

  // Reads lines until one starts with `prefix`; returns the rest of that line.
  std::optional<std::string> wait_for_line(const std::string& prefix,
                                           std::chrono::milliseconds timeout);

  // Everything read from stdout so far, including lines already returned.
  const std::string& output() const { return all_output_; }

  void signal(int sig);

  // Waits for exit; returns the exit code (128 + signal when killed) or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);

  // Reads the rest of stdout until EOF or timeout and returns all output.
  std::string drain(std::chrono::milliseconds timeout);

  bool running();

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::optional<int> exit_code_;
  std::string pending_;
  std::string all_output_;
};

}  // namespace weightcast::testing
