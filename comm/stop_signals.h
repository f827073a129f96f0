// The stop signals (SIGINT, SIGTERM) kept away from worker threads: a process blocks them before
// it starts threads, which inherit the mask, so no handler runs inside library code and no
// blocking call in a worker sees EINTR; one chosen thread takes them with sigwait() (or keeps
// them for an interpreter that polls for them).
//
// Lifetime/threading: changes the calling thread's signal mask only.
#pragma once

#include <pthread.h>

#include <csignal>

namespace weightcast::comm {

// Blocks SIGINT and SIGTERM in the calling thread and returns that set (for sigwait()).
inline sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

}  // namespace weightcast::comm
