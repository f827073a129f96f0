// C10dServerSession: one connection of a C10dStoreServer, served on its own thread (see
// comm/store/c10d_store_server.cc): reads the byte stream, decodes torch requests as they complete
// and answers them; a WAIT whose keys are missing is kept as pending and answered when a change
// makes them present. C10dServerShared is what every connection of one server shares: the options,
// the stored keys, the counters and the budget of buffered bytes.
// Lifetime: a session lives on its connection thread's stack; the shared part is owned by the
// server and outlives every connection thread. Internal to comm/store.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "comm/store/c10d_protocol.h"
#include "comm/store/c10d_store_server.h"
#include "comm/store/c10d_store_state.h"

namespace weightcast::comm {

struct C10dServerShared {
  explicit C10dServerShared(C10dStoreServerOptions o)
      : opts(std::move(o)),
        limits{opts.max_key_bytes, opts.max_value_bytes, opts.max_keys_per_request,
               opts.max_request_bytes},
        state(opts.max_store_bytes, opts.max_keys, opts.max_value_bytes) {}

  C10dStoreServerOptions opts;
  c10d_protocol::Limits limits;
  const std::atomic<bool>* stopping = nullptr;  // the connection server's stop flag
  C10dStoreState state;

  std::atomic<std::uint64_t> rejected_frames{0}, dropped_stalled{0}, dropped_over_cap{0}, torch1{0},
      torch2{0};
  std::atomic<std::size_t> buffered{0};  // drawn from max_buffered_bytes by all connections
};

class C10dServerSession {
 public:
  // `wake_fd`: an eventfd the state writes when watched keys change.
  C10dServerSession(C10dServerShared& shared, int fd, int wake_fd)
      : shared_(shared), fd_(fd), wake_fd_(wake_fd) {}

  // Serves the connection until EOF, a protocol error, a refusal, a stall or the server's stop.
  void serve_loop();
  // Bytes this connection still draws from the shared budget (the caller gives them back).
  std::size_t charged() const { return charged_; }

 private:
  // Logs why the connection is dropped, with its peer, and counts it; returns false, for callers
  // to return.
  bool refuse(const std::string& why);
  // Brings the connection's draw on the shared budget to what its buffers hold beyond
  // kFreeBufferBytes; refuses (false) when that would pass max_buffered_bytes.
  bool recharge();
  // Decodes and answers every complete request in in_; false drops the connection.
  bool process();
  bool handle(const c10d_protocol::Request& req);
  bool answer(const c10d_protocol::Request& req);  // handle() past VALIDATE
  bool handle_add(const c10d_protocol::Request& req);
  bool handle_multi_get(const c10d_protocol::Request& req);
  // Sends the replies that passed max_unsent_reply_bytes before anything more is read.
  bool flush_over_cap();
  bool handle_wait(std::vector<std::string> keys);
  void cancel_waits();
  void answer_ready_waits();
  bool flush();

  C10dServerShared& shared_;
  int fd_ = -1;
  int wake_fd_ = -1;
  std::optional<c10d_protocol::Generation> gen_;
  bool seen_first_ = false;
  std::list<std::vector<std::string>> pending_;  // outstanding WAITs, oldest first
  std::string in_;                               // bytes read, not yet decoded
  std::string out_;                              // replies not yet sent
  bool consumed_ = false;                        // the last process() completed a request
  bool refused_ = false;                         // refuse() ran: a cap, not a bad frame
  std::size_t charged_ = 0;                      // bytes drawn from the shared buffer budget
};

}  // namespace weightcast::comm
