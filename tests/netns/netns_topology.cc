#include "tests/netns/netns_topology.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace weightcast::testing {

namespace {

using Clock = std::chrono::steady_clock;

// Every namespace of ours starts with this, then the owner's pid: "wcnt-1234-h0".
constexpr const char* kPrefix = "wcnt-";

// Both locations ip(8) may use for named namespaces.
constexpr const char* kNetnsDirs[] = {"/run/netns/", "/var/run/netns/"};

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string all = path;
    std::size_t start = 0;
    while (start <= all.size()) {
      const std::size_t end = all.find(':', start);
      dirs.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  // ctest may run without the sbin directories in PATH.
  for (const char* d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.emplace_back(d);
  for (const auto& d : dirs) {
    const std::string candidate = (d.empty() ? std::string(".") : d) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

std::string ip_program() {
  static const std::string path = find_program("ip");
  return path;
}

void must(const std::vector<std::string>& argv) {
  if (run_command(argv) != 0) {
    std::string text;
    for (const auto& a : argv) text += (text.empty() ? "" : " ") + a;
    throw std::runtime_error("command failed: " + text);
  }
}

// Shell text that kills every process inside the namespaces and deletes them; quiet, and
// harmless when they are already gone.
std::string cleanup_script(const std::vector<std::string>& namespaces) {
  const std::string ip = ip_program();
  std::string script;
  for (const auto& ns : namespaces) {
    script += "for p in $(" + ip + " netns pids " + ns + " 2>/dev/null); do kill -9 $p; done; ";
    script += ip + " netns del " + ns + " 2>/dev/null; ";
  }
  return script + "exit 0";
}

std::vector<std::string> list_namespaces() {
  std::vector<std::string> out;
  for (const char* dir : kNetnsDirs) {
    DIR* d = ::opendir(dir);
    if (d == nullptr) continue;
    while (const dirent* e = ::readdir(d)) out.emplace_back(e->d_name);
    ::closedir(d);
    if (!out.empty()) break;
  }
  return out;
}

// Namespaces of ours left by a run whose process is gone (its guardian did not get to run).
void remove_orphans() {
  std::vector<std::string> orphans;
  for (const auto& name : list_namespaces()) {
    if (name.rfind(kPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + std::string(kPrefix).size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      orphans.push_back(name);
    }
  }
  if (!orphans.empty()) run_command({"/bin/sh", "-c", cleanup_script(orphans)});
}

}  // namespace

int run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  if (argv.empty()) return -1;
  const std::string program = find_program(argv[0]);
  if (program.empty()) return -1;
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0 && errno != EINTR) return -1;
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return 124;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::optional<std::string> netns_unavailable_reason() {
  if (ip_program().empty()) return "ip(8) (iproute2) is not installed";
  if (::geteuid() != 0) return "network namespaces need root (CAP_NET_ADMIN); running as non-root";
  const std::string probe = std::string(kPrefix) + std::to_string(::getpid()) + "-probe";
  if (run_command({ip_program(), "netns", "add", probe}) != 0) {
    return "cannot create a network namespace here ('ip netns add' failed: no CAP_SYS_ADMIN, or "
           "a container that forbids it)";
  }
  // Creating a namespace needs other rights than building links in it: try both.
  const bool links = run_command({ip_program(), "-n", probe, "link", "add", "probe0", "type",
                                  "veth", "peer", "name", "probe1"}) == 0;
  run_command({ip_program(), "netns", "del", probe});
  if (!links) return "cannot create veth links in a network namespace here (no CAP_NET_ADMIN)";
  return std::nullopt;
}

NetnsTopology::NetnsTopology(int hosts) {
  if (hosts < 1 || hosts > 200) throw std::invalid_argument("NetnsTopology: 1..200 hosts");
  prefix_ = std::string(kPrefix) + std::to_string(::getpid()) + "-";
  switch_ns_ = prefix_ + "sw";
  for (int i = 0; i < hosts; ++i) hosts_.push_back(prefix_ + "h" + std::to_string(i));
  remove_orphans();
  start_guardian();
  try {
    build();
  } catch (...) {
    destroy();
    throw;
  }
}

NetnsTopology::~NetnsTopology() {
  destroy();
}

const std::string& NetnsTopology::host_namespace(int host) const {
  return hosts_.at(static_cast<std::size_t>(host));
}

std::string NetnsTopology::host_address(int host) const {
  (void)host_namespace(host);  // range check
  return "198.19.5." + std::to_string(host + 1);
}

void NetnsTopology::build() {
  const std::string ip = ip_program();
  must({ip, "netns", "add", switch_ns_});
  must({ip, "-n", switch_ns_, "link", "add", "br0", "type", "bridge"});
  must({ip, "-n", switch_ns_, "link", "set", "br0", "up"});
  for (int i = 0; i < hosts(); ++i) {
    const std::string& ns = hosts_[static_cast<std::size_t>(i)];
    const std::string port = "p" + std::to_string(i);
    must({ip, "netns", "add", ns});
    must({ip, "-n", ns, "link", "set", "lo", "up"});
    must({ip, "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns",
          switch_ns_});
    must({ip, "-n", ns, "addr", "add", host_address(i) + "/24", "dev", "eth0"});
    must({ip, "-n", ns, "link", "set", "eth0", "up"});
    must({ip, "-n", switch_ns_, "link", "set", port, "master", "br0", "up"});
  }
}

void NetnsTopology::set_link(int host, bool up) {
  (void)host_namespace(host);
  must({ip_program(), "-n", switch_ns_, "link", "set", "p" + std::to_string(host),
        up ? "up" : "down"});
}

std::vector<std::string> NetnsTopology::exec_argv(int host, std::vector<std::string> argv) const {
  std::vector<std::string> out = {ip_program(), "netns", "exec", host_namespace(host)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

void NetnsTopology::start_guardian() {
  std::vector<std::string> all = hosts_;
  all.push_back(switch_ns_);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  // `read` returns at EOF: when this process closed the pipe or died.
  std::string script = "read _ignored; " + cleanup_script(all);
  std::vector<std::string> args = {"/bin/sh", "-c", script};
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const int rc = posix_spawn(&guardian_, "/bin/sh", &actions, &attr, cargs.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    guardian_ = -1;
    throw std::runtime_error("cannot start the namespace guardian");
  }
  guardian_fd_ = fds[1];
}

void NetnsTopology::destroy() {
  std::vector<std::string> all = hosts_;
  all.push_back(switch_ns_);
  run_command({"/bin/sh", "-c", cleanup_script(all)}, std::chrono::seconds(20));
  if (guardian_fd_ >= 0) {
    ::close(guardian_fd_);  // the guardian finds nothing left to do and exits
    guardian_fd_ = -1;
  }
  if (guardian_ > 0) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    int status = 0;
    while (::waitpid(guardian_, &status, WNOHANG) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (::waitpid(guardian_, &status, WNOHANG) == 0) {
      ::kill(guardian_, SIGKILL);
      ::waitpid(guardian_, &status, 0);
    }
    guardian_ = -1;
  }
}

void enter_namespace(const std::string& ns) {
  for (const char* dir : kNetnsDirs) {
    const int fd = ::open((std::string(dir) + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const int rc = ::setns(fd, CLONE_NEWNET);
    ::close(fd);
    if (rc != 0) throw std::runtime_error("setns into network namespace " + ns + " failed");
    return;
  }
  throw std::runtime_error("no network namespace named " + ns);
}

void run_in_namespace(const std::string& ns, const std::function<void()>& fn) {
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      enter_namespace(ns);
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace weightcast::testing
