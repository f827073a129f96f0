#include "sync/engine/receive/channel.h"

#include <exception>
#include <thread>

#include "comm/errors.h"
#include "sync/engine/receive/rendezvous.h"

namespace weightcast::sync::engine {

namespace {

class CommChannel final : public BucketChannel {
 public:
  explicit CommChannel(std::unique_ptr<comm::Communicator> comm) : comm_(std::move(comm)) {}

  void receive(void* buffer, std::size_t bytes, comm::Millis timeout,
               const comm::ReceivedFn& on_received) override {
    comm::BroadcastOptions opts;
    opts.buffer = buffer;
    opts.bytes = bytes;
    opts.root = 0;
    opts.memory = memory();
    opts.timeout = timeout;
    opts.on_received = on_received;
    comm_->broadcast(opts);
  }
  void abort() override { comm_->abort(); }
  comm::MemoryKind memory() const override {
    return comm_->backend() == "nccl" ? comm::MemoryKind::kCuda : comm::MemoryKind::kHost;
  }
  int group_rank() const override { return comm_->rank(); }
  std::string data_path() const override { return std::string(comm_->data_path()); }

 private:
  std::unique_ptr<comm::Communicator> comm_;
};

}  // namespace

std::unique_ptr<BucketChannel> make_comm_channel(std::unique_ptr<comm::Communicator> comm) {
  WC_ENFORCE(comm != nullptr);
  return std::make_unique<CommChannel>(std::move(comm));
}

std::vector<std::unique_ptr<BucketChannel>> connect_group(const GroupSpec& spec,
                                                          const ConnectOptions& opts) {
  WC_ENFORCE_GT(opts.rank_count, 0, "engine rank count");
  WC_ENFORCE_GE(spec.rank_offset, 1, "rank_offset (group rank 0 is the source)");
  WC_ENFORCE_LE(spec.rank_offset + opts.rank_count, spec.world_size,
                "rank_offset + engine ranks must fit in world_size");
  const comm::Deadline deadline = comm::deadline_after(opts.init_timeout);
  const RendezvousPlan plan = detect_rendezvous(spec, opts, deadline);
  const auto n = static_cast<std::size_t>(opts.rank_count);
  std::vector<std::unique_ptr<comm::Communicator>> comms(n);
  std::vector<std::exception_ptr> errors(n);
  {
    // The ranks must rendezvous concurrently: each one's join waits for all the others.
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        try {
          comms[i] = join_rank(spec, opts, plan, static_cast<int>(i), deadline);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
  }
  // Report the most informative failure: a timeout is often only the consequence of another
  // rank's refusal (a bad backend, a refused token).
  std::exception_ptr first_timeout;
  for (auto& error : errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const comm::TimeoutError&) {
      if (!first_timeout) first_timeout = error;
    } catch (...) {
      for (auto& c : comms) {
        if (c) c->abort();
      }
      throw;
    }
  }
  if (first_timeout) {
    for (auto& c : comms) {
      if (c) c->abort();
    }
    std::rethrow_exception(first_timeout);
  }
  std::vector<std::unique_ptr<BucketChannel>> out;
  for (auto& c : comms) out.push_back(make_comm_channel(std::move(c)));
  return out;
}

}  // namespace weightcast::sync::engine
