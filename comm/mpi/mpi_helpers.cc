#include "comm/mpi/mpi_helpers.h"

#include <cstdio>
#include <utility>

#include "comm/errors.h"
#include "comm/mpi/pending.h"

namespace weightcast::comm::mpi {

using detail::check_mpi;

MpiGuard::MpiGuard(int* argc, char*** argv, Millis drain_timeout) : drain_timeout_(drain_timeout) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw ConfigError("MPI was already finalized and cannot be initialized again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&thread_level_);
  } else {
    // Ask for the most; accept what the library provides and let callers read it back.
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_);
    if (rc != MPI_SUCCESS) throw ConfigError("MPI_Init_thread failed");
    owns_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
}

MpiGuard::~MpiGuard() {
  if (!owns_) return;
  const std::size_t left = drain_stranded(deadline_after(drain_timeout_));
  if (left > 0) {
    // Finalizing with collectives in flight would wait on peers that may never come.
    std::fprintf(stderr,
                 "weightcast: rank %d: %zu timed-out MPI operation(s) still pending at exit; "
                 "calling MPI_Abort\n",
                 world_rank_, left);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
}

Comm::~Comm() {
  reset();
}

Comm::Comm(Comm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}

Comm& Comm::operator=(Comm&& other) noexcept {
  if (this != &other) {
    reset();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
  }
  return *this;
}

void Comm::reset() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 1;
  MPI_Finalized(&finalized);
  // MPI_Comm_free only marks the communicator for deallocation; it does not wait on peers.
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

int Comm::rank() const {
  WC_ENFORCE(comm_ != MPI_COMM_NULL, "null communicator");
  int rank = -1;
  check_mpi(MPI_Comm_rank(comm_, &rank), "MPI_Comm_rank", comm_);
  return rank;
}

int Comm::size() const {
  WC_ENFORCE(comm_ != MPI_COMM_NULL, "null communicator");
  int size = 0;
  check_mpi(MPI_Comm_size(comm_, &size), "MPI_Comm_size", comm_);
  return size;
}

std::vector<int> Comm::world_ranks() const {
  const int n = size();
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(comm_, &group), "MPI_Comm_group", comm_);
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group", MPI_COMM_WORLD);
  std::vector<int> local(static_cast<std::size_t>(n));
  std::vector<int> global(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) local[static_cast<std::size_t>(i)] = i;
  const int rc = MPI_Group_translate_ranks(group, n, local.data(), world, global.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  check_mpi(rc, "MPI_Group_translate_ranks", comm_);
  return global;
}

Comm split(MPI_Comm parent, int color, int key, Deadline deadline) {
  WC_ENFORCE_GE(color, 0, "color must not be negative (MPI_UNDEFINED is not supported)");
  barrier(parent, deadline);
  MPI_Comm out = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(parent, color, key, &out), "MPI_Comm_split", parent);
  return Comm(out);
}

bool spans_hosts(MPI_Comm comm, Deadline deadline) {
  barrier(comm, deadline);
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type", comm);
  const Comm owned(local);
  int size = 0, local_size = 0;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size", comm);
  check_mpi(MPI_Comm_size(local, &local_size), "MPI_Comm_size", local);
  // Split by host, every part is smaller than the whole exactly when there are several hosts.
  return local_size < size;
}

namespace {

void enforce_world(const Topology& topo, MPI_Comm world) {
  int size = 0;
  check_mpi(MPI_Comm_size(world, &size), "MPI_Comm_size", world);
  WC_ENFORCE_EQ(size, topo.world_size(), "communicator size differs from the topology's");
  int rank = -1;
  check_mpi(MPI_Comm_rank(world, &rank), "MPI_Comm_rank", world);
  WC_ENFORCE_EQ(rank, topo.world_rank(), "communicator rank differs from the topology's");
}

}  // namespace

Comm tp_group(const Topology& topo, MPI_Comm world, Deadline deadline) {
  enforce_world(topo, world);
  // Same (dp, pp) cell: the colors are the world ranks with tp_rank 0, divided by tp.
  return split(world, topo.dp_rank() + topo.dp_size() * topo.pp_rank(), topo.tp_rank(), deadline);
}

Comm dp_group(const Topology& topo, MPI_Comm world, Deadline deadline) {
  enforce_world(topo, world);
  return split(world, topo.tp_rank() + topo.tp_size() * topo.pp_rank(), topo.dp_rank(), deadline);
}

Comm stage_group(const Topology& topo, MPI_Comm world, Deadline deadline) {
  enforce_world(topo, world);
  return split(world, topo.pp_rank(), topo.rank_in_stage(), deadline);
}

}  // namespace weightcast::comm::mpi
