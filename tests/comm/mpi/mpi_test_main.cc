// main() of the MPI test binary, run by ctest as `mpirun <flags> -np 4 weightcast_mpi_test`.
//
// Every rank runs every test and asserts; rank 0 prints the usual GoogleTest report, the other
// ranks print only their failures, prefixed with their rank. After each test the ranks agree
// (through a bounded allgather) on who failed; on any failure every rank learns it and rank 0
// calls MPI_Abort, because the collectives of the next test would no longer line up. Either
// way mpirun exits non-zero, so ctest sees the failure.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/mpi_helpers.h"
#include "tests/comm/mpi/mpi_test_env.h"

namespace weightcast::comm::mpi::testing {

namespace {

MpiGuard* g_guard = nullptr;

// Bounded: a rank that is stuck elsewhere must not make the others hang here.
std::vector<int> allgather_flags(MPI_Comm comm, int flag, Millis timeout) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> flags(static_cast<std::size_t>(size), 0);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallgather(&flag, 1, MPI_INT, flags.data(), 1, MPI_INT, comm, &request);
  const Deadline deadline = deadline_after(timeout);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (expired(deadline)) {
      std::fprintf(stderr, "[rank %d] peers did not report their test result within %lld ms\n",
                   g_guard->world_rank(), static_cast<long long>(timeout.count()));
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return flags;
}

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

class AgreeOnFailure : public ::testing::EmptyTestEventListener {
 public:
  AgreeOnFailure(MPI_Comm comm, int rank) : comm_(comm), rank_(rank) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int failed = info.result()->Failed() ? 1 : 0;
    const std::vector<int> flags = allgather_flags(comm_, failed, Millis(60000));
    std::string ranks;
    for (std::size_t r = 0; r < flags.size(); ++r) {
      if (flags[r]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    }
    if (ranks.empty()) return;
    if (rank_ == 0) {
      std::fprintf(stderr, "weightcast_mpi_test: %s.%s failed on rank(s) %s; aborting\n",
                   info.test_suite_name(), info.name(), ranks.c_str());
      std::fflush(stderr);
      std::fflush(stdout);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // Rank 0's abort ends this rank too; should it not, do not run on out of step.
    std::this_thread::sleep_for(std::chrono::seconds(30));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  MPI_Comm comm_;
  int rank_;
};

}  // namespace

const MpiGuard& guard() {
  return *g_guard;
}

}  // namespace weightcast::comm::mpi::testing

int main(int argc, char** argv) {
  namespace mpi = weightcast::comm::mpi;
  namespace wt = weightcast::comm::mpi::testing;
  mpi::MpiGuard guard(&argc, &argv);
  wt::g_guard = &guard;
  ::testing::InitGoogleTest(&argc, argv);

  const int rank = guard.world_rank();
  if (guard.world_size() != wt::kWorldSize) {
    if (rank == 0) {
      std::fprintf(stderr, "weightcast_mpi_test needs exactly %d ranks (mpirun -np %d), got %d\n",
                   wt::kWorldSize, wt::kWorldSize, guard.world_size());
    }
    return 2;
  }

  // A communicator of its own, so the agreement never interleaves with a test's collectives.
  mpi::Comm agreement =
      mpi::duplicate(MPI_COMM_WORLD, weightcast::comm::deadline_after(std::chrono::seconds(30)));
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new wt::FailurePrinter(rank));
  }
  listeners.Append(new wt::AgreeOnFailure(agreement.get(), rank));

  const int result = RUN_ALL_TESTS();
  return result;
}
