#include "launcher/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace weightcast::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kReapAfterKill{5000};
constexpr milliseconds kReapPoll{5};

milliseconds left_until(Clock::time_point deadline) {
  return std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, ChildOptions options)
    : options_(std::move(options)) {
  if (argv.empty()) throw std::invalid_argument("ChildProcess needs argv[0]");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  for (const auto& e : options_.extra_env) env_store.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);

  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error("fork failed");
  }
  if (pid_ == 0) {
    dup2(fds[1], STDOUT_FILENO);
    if (options_.own_group) ::setpgid(0, 0);
    // A parent gone before prctl took effect would never send the signal: exit instead.
    if (options_.die_with_parent &&
        (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)) {
      _exit(127);
    }
    execvpe(args[0], args.data(), envp.data());
    const char msg[] = "exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(fds[1]);
  out_fd_ = fds[0];
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_),
      out_fd_(other.out_fd_),
      options_(std::move(other.options_)),
      exit_code_(other.exit_code_),
      pending_(std::move(other.pending_)),
      all_output_(std::move(other.all_output_)) {
  other.pid_ = -1;
  other.out_fd_ = -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exit_code_) {
    if (options_.stop_grace > milliseconds(0)) {
      kill_now(SIGTERM);
      wait(options_.stop_grace);
    }
    if (!exit_code_) {
      kill_now(SIGKILL);
      wait(kReapAfterKill);
    }
  }
  if (out_fd_ >= 0) close(out_fd_);
}

void ChildProcess::kill_now(int sig) {
  if (options_.own_group) ::kill(-pid_, sig);  // its process group: helpers it started go too
  ::kill(pid_, sig);
}

std::optional<std::string> ChildProcess::read_line(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    if (out_fd_ < 0) return std::nullopt;
    const milliseconds left = left_until(deadline);
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{out_fd_, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    char buf[4096];
    const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
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

std::optional<std::string> ChildProcess::wait_for_line(const std::string& prefix,
                                                       milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    auto line = read_line(left_until(deadline));
    if (!line) return std::nullopt;
    if (line->rfind(prefix, 0) == 0) return line->substr(prefix.size());
  }
  return std::nullopt;
}

std::string ChildProcess::line(milliseconds timeout, const std::string& what) {
  if (auto l = read_line(timeout)) return *l;
  throw std::runtime_error(what + (out_fd_ < 0 ? ": exited early" : ": no output in time"));
}

std::string ChildProcess::line_starting(const std::string& prefix, milliseconds timeout,
                                        const std::string& what) {
  if (auto rest = wait_for_line(prefix, timeout)) return prefix + *rest;
  throw std::runtime_error(what + (out_fd_ < 0 ? ": exited early" : ": no output in time"));
}

std::string ChildProcess::drain(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (out_fd_ >= 0 && Clock::now() < deadline) {
    if (!read_line(left_until(deadline)) && out_fd_ >= 0) break;
  }
  return all_output_;
}

void ChildProcess::signal(int sig) {
  if (pid_ > 0 && !exit_code_) kill_now(sig);
}

std::optional<int> ChildProcess::wait(milliseconds timeout) {
  if (exit_code_ || pid_ <= 0) return exit_code_;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (r < 0 && errno == ECHILD) {
      pid_ = -1;  // reaped elsewhere: gone, with no code to report and nothing left to signal
      return std::nullopt;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(kReapPoll);
  }
}

int ChildProcess::wait_exit(milliseconds timeout) {
  if (auto code = wait(timeout)) return *code;
  if (pid_ > 0) kill_now(SIGKILL);
  return wait(kReapAfterKill).value_or(137);
}

bool ChildProcess::running() {
  return !wait(milliseconds(0)).has_value() && pid_ > 0;
}

}  // namespace weightcast::launcher
