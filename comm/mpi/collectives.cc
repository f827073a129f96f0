// Bounded collectives: each is a PendingOp posted non-blocking and polled by run_bounded.
#include <climits>
#include <cstdint>
#include <memory>
#include <utility>

#include "comm/errors.h"
#include "comm/mpi/mpi_helpers.h"
#include "comm/mpi/pending.h"

namespace weightcast::comm::mpi {

namespace {

using detail::check_mpi;
using detail::PendingOp;
using detail::test;

struct CommInfo {
  int rank = -1;
  int size = 0;
};

CommInfo info_of(MPI_Comm comm) {
  WC_ENFORCE(comm != MPI_COMM_NULL, "null communicator");
  CommInfo info;
  check_mpi(MPI_Comm_rank(comm, &info.rank), "MPI_Comm_rank", comm);
  check_mpi(MPI_Comm_size(comm, &info.size), "MPI_Comm_size", comm);
  return info;
}

void enforce_root(int root, const CommInfo& info) {
  WC_ENFORCE_GE(root, 0, "root must not be negative");
  WC_ENFORCE_LT(root, info.size, "root must be below the communicator size");
}

std::string describe(const char* op, int root) {
  return std::string(op) + " (root " + std::to_string(root) + ")";
}

// Runs `op` until it completes or `deadline` passes (detail::run_bounded, which throws on failure
// and keeps a stranded operation alive), then returns what `take` makes of the completed op.
template <typename Op, typename Take>
auto run_to_end(std::unique_ptr<Op> op, Deadline deadline, const std::string& what, MPI_Comm comm,
                Take take) {
  Op& done = *op;
  std::unique_ptr<PendingOp> pending = std::move(op);
  detail::run_bounded(pending, deadline, what, comm);
  return take(done);
}

class BarrierOp : public PendingOp {
 public:
  explicit BarrierOp(MPI_Comm comm) : comm_(comm) {
    check_mpi(MPI_Ibarrier(comm_, &request_), "MPI_Ibarrier", comm_);
  }
  bool progress() override { return test(request_); }

 private:
  MPI_Comm comm_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

class DupOp : public PendingOp {
 public:
  explicit DupOp(MPI_Comm parent) : parent_(parent) {
    check_mpi(MPI_Comm_idup(parent_, &result_, &request_), "MPI_Comm_idup", parent_);
  }
  ~DupOp() override {
    // A stranded dup that completed late: nobody will ever use the new communicator.
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (result_ != MPI_COMM_NULL && request_ == MPI_REQUEST_NULL && !finalized) {
      MPI_Comm_free(&result_);
    }
  }
  bool progress() override { return test(request_); }
  MPI_Comm release() { return std::exchange(result_, MPI_COMM_NULL); }

 private:
  MPI_Comm parent_;
  MPI_Comm result_ = MPI_COMM_NULL;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// Phase 1 shares the block sizes with every rank (an allgather, so that when it completes every
// rank knows all the others have arrived); then the root sizes its buffer and every rank posts
// phase 2, the blocks. Phase 2 polls fast (moving()) only between ranks that are all there: a
// rank that arrived early sleeps between polls instead of spinning while a peer still computes.
class GathervOp : public PendingOp {
 public:
  GathervOp(MPI_Comm comm, int root, int rank, int size, std::shared_ptr<const void> owner,
            std::span<const std::byte> send, GatheredBytes reuse)
      : comm_(comm),
        root_(root),
        size_(size),
        owner_(std::move(owner)),
        send_(send),
        result_(std::move(reuse)) {
    my_bytes_ = send_.size();
    WC_ENFORCE_LE(my_bytes_, static_cast<std::uint64_t>(INT_MAX), "gatherv block too large");
    is_root_ = rank == root;
    sizes_.resize(static_cast<std::size_t>(size_));
    check_mpi(MPI_Iallgather(&my_bytes_, 1, MPI_UINT64_T, sizes_.data(), 1, MPI_UINT64_T, comm_,
                             &sizes_request_),
              "MPI_Iallgather", comm_);
  }

  bool progress() override {
    if (!test(sizes_request_)) return false;
    if (!blocks_posted_) {
      if (is_root_) {
        size_receive_buffer();
      } else {
        moving_bytes_ = my_bytes_ > 0;
      }
      post_blocks();
    }
    return test(blocks_request_);
  }

  // Bulk bytes between ranks that have all arrived are in flight: the root receives some, or
  // this rank sends a non-empty block.
  bool moving() const override {
    return blocks_posted_ && blocks_request_ != MPI_REQUEST_NULL && moving_bytes_;
  }

  GatheredBytes take_result() { return std::move(result_); }

 private:
  void size_receive_buffer() {
    counts_.resize(static_cast<std::size_t>(size_));
    displs_.resize(static_cast<std::size_t>(size_));
    result_.offsets.assign(static_cast<std::size_t>(size_) + 1, 0);
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < sizes_.size(); ++r) {
      WC_ENFORCE_LE(total, static_cast<std::uint64_t>(INT_MAX), "gatherv total too large");
      displs_[r] = static_cast<int>(total);
      counts_[r] = static_cast<int>(sizes_[r]);
      total += sizes_[r];
      result_.offsets[r + 1] = static_cast<std::size_t>(total);
    }
    // Grows only: a reused buffer keeps its pages (and skips zero-filling what it overwrites).
    if (result_.data.size() < total) result_.data.resize(static_cast<std::size_t>(total));
    moving_bytes_ = total > my_bytes_;
  }

  void post_blocks() {
    blocks_posted_ = true;
    check_mpi(
        MPI_Igatherv(send_.data(), static_cast<int>(my_bytes_), MPI_BYTE, result_.data.data(),
                     counts_.data(), displs_.data(), MPI_BYTE, root_, comm_, &blocks_request_),
        "MPI_Igatherv", comm_);
  }

  MPI_Comm comm_;
  int root_;
  int size_;
  bool is_root_ = false;
  bool blocks_posted_ = false;
  bool moving_bytes_ = false;          // the blocks phase moves bytes between ranks
  std::shared_ptr<const void> owner_;  // keeps send_'s memory alive while MPI may read it
  std::span<const std::byte> send_;
  std::uint64_t my_bytes_ = 0;
  std::vector<std::uint64_t> sizes_;
  std::vector<int> counts_;
  std::vector<int> displs_;
  GatheredBytes result_;
  MPI_Request sizes_request_ = MPI_REQUEST_NULL;
  MPI_Request blocks_request_ = MPI_REQUEST_NULL;
};

// Phase 1 broadcasts the length; non-roots then size their buffer and post phase 2.
class BroadcastStringOp : public PendingOp {
 public:
  BroadcastStringOp(MPI_Comm comm, int root, bool is_root, std::string value)
      : comm_(comm), root_(root), is_root_(is_root), value_(std::move(value)) {
    if (is_root_) {
      WC_ENFORCE_LE(value_.size(), kMaxBroadcastStringBytes,
                    "broadcast_string is for small values");
      length_ = value_.size();
    }
    check_mpi(MPI_Ibcast(&length_, 1, MPI_UINT64_T, root_, comm_, &length_request_), "MPI_Ibcast",
              comm_);
    if (is_root_) post_value();
  }

  bool progress() override {
    if (!test(length_request_)) return false;
    if (!value_posted_) {
      // The root is another process of this job, but a corrupt length must not allocate.
      WC_ENFORCE_LE(length_, static_cast<std::uint64_t>(kMaxBroadcastStringBytes));
      value_.assign(static_cast<std::size_t>(length_), '\0');
      post_value();
    }
    return test(value_request_);
  }

  std::string take_value() { return std::move(value_); }

 private:
  void post_value() {
    value_posted_ = true;
    check_mpi(MPI_Ibcast(value_.data(), static_cast<int>(length_), MPI_CHAR, root_, comm_,
                         &value_request_),
              "MPI_Ibcast", comm_);
  }

  MPI_Comm comm_;
  int root_;
  bool is_root_;
  bool value_posted_ = false;
  std::string value_;
  std::uint64_t length_ = 0;
  MPI_Request length_request_ = MPI_REQUEST_NULL;
  MPI_Request value_request_ = MPI_REQUEST_NULL;
};

}  // namespace

std::span<const std::byte> GatheredBytes::block(int rank) const {
  WC_ENFORCE_GE(rank, 0);
  WC_ENFORCE_LT(rank, size(), "block rank out of range");
  const auto r = static_cast<std::size_t>(rank);
  return std::span<const std::byte>(data).subspan(offsets[r], offsets[r + 1] - offsets[r]);
}

GatheredBytes gatherv_bytes(MPI_Comm comm, int root, std::vector<std::byte> send, Deadline deadline,
                            GatheredBytes reuse) {
  auto owner = std::make_shared<const std::vector<std::byte>>(std::move(send));
  const std::span<const std::byte> bytes(*owner);
  return gatherv_bytes(comm, root, std::move(owner), bytes, deadline, std::move(reuse));
}

GatheredBytes gatherv_bytes(MPI_Comm comm, int root, std::shared_ptr<const void> owner,
                            std::span<const std::byte> send, Deadline deadline,
                            GatheredBytes reuse) {
  const CommInfo info = info_of(comm);
  enforce_root(root, info);
  WC_ENFORCE(send.empty() || owner != nullptr, "gatherv_bytes: a block needs an owner");
  if (info.rank != root) reuse = GatheredBytes{};
  return run_to_end(std::make_unique<GathervOp>(comm, root, info.rank, info.size, std::move(owner),
                                                send, std::move(reuse)),
                    deadline, describe("gatherv_bytes", root), comm,
                    [](GathervOp& op) { return op.take_result(); });
}

void barrier(MPI_Comm comm, Deadline deadline) {
  info_of(comm);
  std::unique_ptr<PendingOp> pending = std::make_unique<BarrierOp>(comm);
  detail::run_bounded(pending, deadline, "barrier", comm);
}

std::string broadcast_string(MPI_Comm comm, int root, std::string value, Deadline deadline) {
  const CommInfo info = info_of(comm);
  enforce_root(root, info);
  return run_to_end(
      std::make_unique<BroadcastStringOp>(comm, root, info.rank == root, std::move(value)),
      deadline, describe("broadcast_string", root), comm,
      [](BroadcastStringOp& op) { return op.take_value(); });
}

Comm duplicate(MPI_Comm parent, Deadline deadline) {
  info_of(parent);
  return run_to_end(std::make_unique<DupOp>(parent), deadline, "communicator duplicate", parent,
                    [](DupOp& op) { return Comm(op.release()); });
}

}  // namespace weightcast::comm::mpi
