#include "launcher/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

namespace weightcast::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Polls for the exit until `deadline`; returns the raw status, or -1 if still running.
int reap_until(pid_t pid, Clock::time_point deadline) {
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return 0;  // already reaped elsewhere
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error("fork failed");
  }
  if (pid_ == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  fd_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    if (reap_until(pid_, Clock::now() + milliseconds(5000)) == -1) {
      kill(pid_, SIGKILL);
      reap_until(pid_, Clock::now() + milliseconds(5000));
    }
  }
  if (fd_ >= 0) close(fd_);
}

std::string ChildProcess::line(milliseconds timeout, const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (auto nl = buf_.find('\n'); nl != std::string::npos) {
      std::string l = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return l;
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
      throw std::runtime_error(what + ": no output in time");
    }
    char tmp[4096];
    const ssize_t n = read(fd_, tmp, sizeof(tmp));
    if (n <= 0) throw std::runtime_error(what + ": exited early");
    buf_.append(tmp, static_cast<std::size_t>(n));
  }
}

std::string ChildProcess::line_starting(const std::string& prefix, milliseconds timeout,
                                        const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    std::string l = line(std::max(milliseconds(1), left), what);
    if (l.rfind(prefix, 0) == 0) return l;
  }
}

int ChildProcess::wait_exit(milliseconds timeout) {
  int status = reap_until(pid_, Clock::now() + timeout);
  if (status == -1) {
    kill(pid_, SIGKILL);
    status = reap_until(pid_, Clock::now() + milliseconds(5000));
  }
  pid_ = -1;
  return status == -1 ? 137 : exit_code(status);
}

}  // namespace weightcast::launcher
