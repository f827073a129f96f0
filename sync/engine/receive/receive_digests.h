// ReceiveDigests: the digests of a bucket's tensors, computed as its bytes land.
//
// Same-host single copy fills a receive buffer piece by piece (comm::BroadcastOptions::
// on_received); digesting each piece right after it landed reads it from the cache instead of
// reading the whole bucket again from memory afterwards (docs/performance.md: "One pass over
// each byte"). A tensor inside one piece is digested in one call, one spread over several pieces
// incrementally (the same XXH3-128 either way). A path that reports the whole buffer in one call
// (sockets, NCCL) is left to the unpack thread, where digesting overlaps the next bucket's
// receive; so are plans whose tensors overlap, and ranges that do not arrive in order.
// Lifetime: the plan and the buffer must outlive it. Threading: one thread (the receive thread).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "sync/model/bucket.h"
#include "sync/model/checksum.h"

namespace weightcast::sync::engine {

class ReceiveDigests {
 public:
  // `wanted[i]`: whether plan.entries[i] needs a digest (it is routed to a runner).
  ReceiveDigests(const BucketPlan& plan, const std::vector<bool>& wanted, const std::byte* buffer);

  // Bytes [offset, offset + bytes) of the buffer are final.
  void received(std::size_t offset, std::size_t bytes);

  // One entry per plan entry: its digest, or nullopt where it was not wanted or not digested here
  // (the caller digests those itself).
  std::vector<std::optional<Digest>> take();

 private:
  void advance();

  const BucketPlan& plan_;
  const std::byte* const buffer_;
  std::vector<std::size_t> order_;  // wanted entries by offset
  std::size_t next_ = 0;            // order_[next_] is the first entry not digested yet
  std::size_t done_ = 0;            // bytes [0, done_) are final
  bool usable_ = true;
  Hasher hasher_;           // order_[next_]'s first hashed_ bytes, when it spans pieces
  std::size_t hashed_ = 0;  // 0: not started
  std::vector<std::optional<Digest>> digests_;
};

}  // namespace weightcast::sync::engine
