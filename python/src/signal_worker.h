// SignalWorker: how PyUpdater runs C++ work from Python. The work runs on a worker thread with the
// GIL released and SIGINT blocked there, while the calling (interpreter) thread waits in short
// slices and checks for signals. On Ctrl-C it interrupts the work: the flag the work polls is set,
// and during the data phase the data plane's communicator is aborted so a broadcast in progress
// returns at once; the KeyboardInterrupt is raised once the worker has finished.
// Lifetime: owned by its PyUpdater. Threading: run() from the interpreter's thread, one at a time;
// the flags are atomics the worker reads.
#pragma once

#include <atomic>
#include <functional>

#include "comm/communicator.h"

namespace weightcast::python {

class SignalWorker {
 public:
  enum class Phase { kIdle, kData };

  // Runs `fn` on a worker thread and waits, handling signals (needs the GIL; releases it while
  // waiting). Rethrows the KeyboardInterrupt (or other signal error) once `fn` has returned.
  void run(const std::function<void()>& fn);
  // Whether the current run() was interrupted.
  bool interrupted() const { return interrupted_; }
  // The data phase: while in it, an interrupt aborts the communicator.
  void set_phase(Phase phase) { phase_ = phase; }
  // The data plane's communicator (the latest the updater created; null: none).
  void set_communicator(comm::Communicator* comm) { comm_.store(comm); }

 private:
  void interrupt();

  std::atomic<comm::Communicator*> comm_{nullptr};
  std::atomic<Phase> phase_{Phase::kIdle};
  std::atomic<bool> interrupted_{false};
};

}  // namespace weightcast::python
