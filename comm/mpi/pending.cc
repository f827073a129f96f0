#include "comm/mpi/pending.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "comm/mpi/mpi_helpers.h"

namespace weightcast::comm::mpi {
namespace detail {

namespace {

int comm_size(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

// Abandoned operations. Global because MPI is: a stranded request belongs to the process, not
// to any object the caller still holds.
class StrandedList {
 public:
  void add(std::unique_ptr<PendingOp> op) {
    std::lock_guard lock(mu_);
    ops_.push_back(std::move(op));
  }

  std::size_t progress() {
    std::lock_guard lock(mu_);
    std::erase_if(ops_, [](const std::unique_ptr<PendingOp>& op) {
      try {
        return op->progress();
      } catch (const std::exception& e) {
        // progress() throws only with nothing in flight, so dropping the op is safe.
        std::fprintf(stderr, "weightcast: dropping a stranded MPI operation: %s\n", e.what());
        return true;
      }
    });
    return ops_.size();
  }

  std::size_t size() {
    std::lock_guard lock(mu_);
    return ops_.size();
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<PendingOp>> ops_;
};

StrandedList& stranded() {
  static StrandedList* list = new StrandedList();  // never destroyed: may outlive statics
  return *list;
}

// Sleeps between polls: yielding alone would starve the peers of an oversubscribed host, and a
// cap of 1 ms keeps the added latency small next to the collectives we wait for.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }
  // Bytes are moving: poll again as soon as the scheduler lets us, as a blocking MPI call would.
  // A transport that moves a large message in fragments (shared memory without cross-memory
  // attach, TCP) advances only when polled, so sleeping up to 1 ms between polls caps it at a
  // few fragments per millisecond.
  void hurry() {
    std::this_thread::yield();
    delay_ = std::chrono::microseconds(10);
  }

 private:
  std::chrono::microseconds delay_{10};
};

}  // namespace

namespace {

std::string error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

}  // namespace

void check_mpi(int rc, const char* call, MPI_Comm comm) {
  if (rc == MPI_SUCCESS) return;
  throw PeerError("MPI communicator of size " + std::to_string(comm_size(comm)),
                  std::string(call) + " failed: " + error_text(rc));
}

bool test(MPI_Request& request) {
  int done = 0;
  const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) throw PeerError("MPI request", "MPI_Test failed: " + error_text(rc));
  return done != 0;
}

void run_bounded(std::unique_ptr<PendingOp>& op, Deadline deadline, const std::string& what,
                 MPI_Comm comm) {
  const auto start = Clock::now();
  Backoff backoff;
  while (!op->progress()) {
    progress_stranded();
    if (expired(deadline)) {
      stranded().add(std::move(op));
      const auto waited = std::chrono::duration_cast<Millis>(Clock::now() - start);
      int rank = -1;
      MPI_Comm_rank(comm, &rank);
      throw TimeoutError("MPI " + what + " timed out after " + std::to_string(waited.count()) +
                         " ms on a communicator of size " + std::to_string(comm_size(comm)) +
                         " (this rank: " + std::to_string(rank) +
                         "); the operation is still pending, the caller must MPI_Abort");
    }
    if (op->moving()) {
      backoff.hurry();
    } else {
      backoff.pause();
    }
  }
}

void progress_stranded() {
  stranded().progress();
}

}  // namespace detail

std::size_t stranded_operations() {
  return detail::stranded().size();
}

std::size_t drain_stranded(Deadline deadline) {
  detail::Backoff backoff;
  for (;;) {
    const std::size_t left = detail::stranded().progress();
    if (left == 0 || expired(deadline)) return left;
    backoff.pause();
  }
}

}  // namespace weightcast::comm::mpi
