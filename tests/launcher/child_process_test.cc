// launcher/child_process.h, ChildOptions::die_with_parent: a process that started a child with
// it and is then SIGKILLed (no destructor runs) takes the child with it; without it the child
// outlives its parent (the control, so the first test can fail).
#include "launcher/child_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <thread>

namespace weightcast::launcher {
namespace {

using namespace std::chrono_literals;

bool alive(pid_t pid) {
  return kill(pid, 0) == 0 || errno != ESRCH;
}

// Forks a parent that starts `sleep 60` as its child and reports the child's pid; SIGKILLs the
// parent; returns the child's pid and whether it was gone within `wait`.
std::pair<pid_t, bool> orphan_after_parent_killed(bool die_with_parent,
                                                  std::chrono::milliseconds wait) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t parent = fork();
  if (parent == 0) {
    close(fds[0]);
    ChildOptions options;
    options.die_with_parent = die_with_parent;
    ChildProcess child({"sleep", "60"}, options);
    const pid_t pid = child.pid();
    (void)!write(fds[1], &pid, sizeof(pid));
    pause();  // until SIGKILL
    _exit(0);
  }
  close(fds[1]);
  pid_t child = -1;
  EXPECT_EQ(read(fds[0], &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  close(fds[0]);
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  // The orphan is now init's (or a subreaper's) child: it is gone once it exited, or a zombie
  // there until reaped, which kill(pid, 0) still finds; so poll /proc for its state instead.
  const auto until = std::chrono::steady_clock::now() + wait;
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < until) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", child);
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) {
      gone = true;
      break;
    }
    char state = '?';
    (void)!std::fscanf(f, "%*d %*s %c", &state);
    std::fclose(f);
    gone = state == 'Z' || state == 'X';
    if (!gone) std::this_thread::sleep_for(20ms);
  }
  return {child, gone};
}

TEST(ChildProcess, DieWithParentTakesTheChildWhenTheParentIsKilled) {
  const auto [child, gone] = orphan_after_parent_killed(true, 10s);
  EXPECT_TRUE(gone) << "child " << child << " outlived its SIGKILLed parent";
  if (!gone) kill(child, SIGKILL);
}

TEST(ChildProcess, WithoutItTheChildOutlivesItsParent) {
  const auto [child, gone] = orphan_after_parent_killed(false, 1s);
  EXPECT_FALSE(gone);
  EXPECT_TRUE(alive(child));
  kill(child, SIGKILL);
}

}  // namespace
}  // namespace weightcast::launcher
