// Internal to comm/mpi: the polling loop behind every bounded collective.
//
// A PendingOp is one collective in flight, possibly in several phases (a gatherv first gathers
// the block sizes, then the blocks). It owns every buffer MPI may touch, so that on timeout it
// can be moved to the stranded list and outlive the caller's stack frame. Not part of the
// public API.
// Threading: the stranded list is guarded by a mutex; a PendingOp belongs to one thread at a
// time.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/deadline.h"

namespace weightcast::comm::mpi::detail {

class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Tests the requests in flight, posts the next phase when one finishes; true once all are
  // done. Must not throw while a request is in flight.
  virtual bool progress() = 0;
  // True while bulk bytes are in flight between ranks that have all arrived: the poll loop then
  // yields instead of sleeping, since each poll is what moves the transport's next fragments.
  virtual bool moving() const { return false; }
};

// Throws PeerError naming `call` and the communicator size when rc is not MPI_SUCCESS (only
// reachable when the communicator's error handler returns errors instead of aborting).
void check_mpi(int rc, const char* call, MPI_Comm comm);

// True once `request` completed (it is then MPI_REQUEST_NULL); true for MPI_REQUEST_NULL.
// Needs no communicator: a stranded request may outlive the caller's handle to it.
bool test(MPI_Request& request);

// Polls `op` until it completes or `deadline` passes; on timeout moves `op` to the stranded
// list and throws TimeoutError naming `what` and the size of `comm`.
void run_bounded(std::unique_ptr<PendingOp>& op, Deadline deadline, const std::string& what,
                 MPI_Comm comm);

// Drives the stranded operations once; drops the completed ones.
void progress_stranded();

}  // namespace weightcast::comm::mpi::detail
