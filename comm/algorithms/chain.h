// The pipelined chain broadcast over Gloo unbound buffers, and the window of buffers it keeps in
// flight.
//
// Ranks are ordered from the root (position = (rank - root + size) % size); position p receives
// each chunk from p - 1 and forwards it to p + 1 as soon as it has it, so every link carries the
// whole buffer once and all links run at the same time. Each link keeps up to `in_flight` recvs
// posted and `in_flight` sends outstanding. One Gloo slot serves the whole collective: Gloo
// matches sends to recvs per slot and pair in posting order, and both ends post chunks in order.
//
// Lifetime: a ChunkWindow belongs to its communicator and is empty between collectives.
// Threading: chain_broadcast() runs on the caller's thread; ChunkWindow::wake_all() may be called
// from any thread (abort, watchdog) and makes every wait of the collective return.
// Internal to the gloo backend; includes Gloo headers.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/deadline.h"
#include "comm/gloo/gloo_watchdog.h"
#include "comm/transport/link_failure.h"

namespace weightcast::comm::gloo_backend {

class ChunkWindow {
 public:
  explicit ChunkWindow(::gloo::Context& context) : context_(context) {}

  // Creates the buffer for chunk `index` over [ptr, ptr + len). After wake_all() the new buffer
  // is woken at once, so a collective racing with abort cannot miss the wake-up.
  ::gloo::transport::UnboundBuffer& open(std::size_t index, void* ptr, std::size_t len);
  ::gloo::transport::UnboundBuffer& at(std::size_t index);
  void close(std::size_t index);

  // Destroys every buffer. Call only once Gloo can no longer touch them: after the collective
  // completed, or after the transport has been torn down.
  void clear();

  // Sticky: every wait of the collective returns, now and later (abort, failure).
  void wake_all();
  bool woken() const;
  // One-shot: waits return once so they can re-check FailedPeers; a wait that finds nothing new
  // simply waits again.
  void nudge_all();

 private:
  ::gloo::Context& context_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::unique_ptr<::gloo::transport::UnboundBuffer>> live_;
  bool woken_ = false;
};

struct ChainArgs {
  std::uint8_t* data = nullptr;
  std::size_t bytes = 0;
  int root = 0;
  std::size_t chunk_bytes = 0;
  int in_flight = 1;
  std::uint64_t slot = 0;
  Deadline deadline{};
};

// Runs one chain broadcast. Throws LinkFailure or WaitInterrupted; on either, the caller must
// tear the transport down before clearing `window`.
void chain_broadcast(::gloo::Context& context, ChunkWindow& window, const FailedPeers& failed,
                     const ChainArgs& args);

}  // namespace weightcast::comm::gloo_backend
