#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace weightcast::testing {

using Clock = std::chrono::steady_clock;

Subprocess::Subprocess(std::vector<std::string> argv, std::vector<std::string> extra_env) {
  if (argv.empty()) throw std::invalid_argument("Subprocess needs argv[0]");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  for (auto& e : extra_env) env_store.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Child: stdout to the pipe; die with the parent so a crashed test leaves nothing behind.
    dup2(fds[1], STDOUT_FILENO);
    ::setpgid(0, 0);
    execve(args[0], args.data(), envp.data());
    const char msg[] = "exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(fds[1]);
  out_fd_ = fds[0];
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_),
      out_fd_(other.out_fd_),
      exit_code_(other.exit_code_),
      pending_(std::move(other.pending_)),
      all_output_(std::move(other.all_output_)) {
  other.pid_ = -1;
  other.out_fd_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(-pid_, SIGKILL);  // its process group: helpers it started go too
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (out_fd_ >= 0) close(out_fd_);
}

std::optional<std::string> Subprocess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    if (out_fd_ < 0) return std::nullopt;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{out_fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    char buf[4096];
    ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n <= 0) {
      close(out_fd_);
      out_fd_ = -1;
      if (!pending_.empty()) {
        std::string line = std::move(pending_);
        pending_.clear();
        return line;
      }
      return std::nullopt;
    }
    pending_.append(buf, static_cast<std::size_t>(n));
    all_output_.append(buf, static_cast<std::size_t>(n));
  }
}

std::optional<std::string> Subprocess::wait_for_line(const std::string& prefix,
                                                     std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto line = read_line(left);
    if (!line) return std::nullopt;
    if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
  }
  return std::nullopt;
}

std::string Subprocess::drain(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (out_fd_ >= 0 && Clock::now() < deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (!read_line(left) && out_fd_ >= 0) break;
  }
  return all_output_;
}

void Subprocess::signal(int sig) {
  if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
}

std::optional<int> Subprocess::wait(std::chrono::milliseconds timeout) {
  if (exit_code_) return exit_code_;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool Subprocess::running() { return !wait(std::chrono::milliseconds(0)).has_value(); }

}  // namespace weightcast::testing
