// PeerWatch and FailedPeers: notice that a peer's connection is gone while a collective is
// blocked on a different buffer.
//
// Why: when a TCP connection fails, Gloo fails the buffers queued on that pair, but not the one
// it is reading into or writing from at that moment. A collective waiting on exactly that buffer
// would sleep until its deadline although the peer is known to be gone. PeerWatch posts one
// never-matched 1-byte "sentinel" recv per peer on a slot of its own; Gloo fails it with the
// pair. While a collective is active, a background thread probes the sentinels (every
// `interval`), records each newly failed peer in FailedPeers and calls `nudge`, which wakes the
// collective's waits so they can look.
//
// A closed connection is not by itself an error: a peer that finished the collective may close
// its communicator while this rank still drains data it already received. The collective decides
// (see comm/algorithms/chain.cc): it fails only if it still needs something from that peer.
//
// Lifetime: owned by the communicator, created right after rendezvous and destroyed before the
// Gloo context. Threading: FailedPeers is thread-safe; PeerWatch::begin()/end() are called from
// the collective's thread, `nudge` runs on the watchdog thread.
// Internal to the gloo backend; includes Gloo headers.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/deadline.h"

namespace weightcast::comm::gloo_backend {

class FailedPeers {
 public:
  void record(int rank, const std::string& why);
  std::optional<std::string> lookup(int rank) const;
  int any() const;  // a failed rank, or -1
  // The first of `suspects` that failed, else any().
  int first_of(const std::vector<int>& suspects) const;

 private:
  mutable std::mutex mu_;
  std::map<int, std::string> failed_;
};

class PeerWatch {
 public:
  PeerWatch(::gloo::Context& context, FailedPeers& failed, std::function<void()> nudge,
            Millis interval = Millis(20));
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  void begin();  // a collective starts: probe until end()
  void end();
  // Probes once now, on the caller's thread: a collective that failed asks which peers are gone
  // before it names one (the watchdog thread may not have looked since the pair failed).
  void probe_now() { probe_all(); }

 private:
  void run();
  void probe_all();

  FailedPeers& failed_;
  std::function<void()> nudge_;
  Millis interval_;
  struct Sentinel {
    int rank;
    bool failed;
    std::unique_ptr<::gloo::transport::UnboundBuffer> buf;
  };
  std::vector<char> bytes_;
  std::mutex probe_mu_;  // the watchdog thread and probe_now() share the sentinels
  std::vector<Sentinel> sentinels_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool active_ = false;
  bool idle_ = false;  // the thread waits for begin(), not for its next probe
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace weightcast::comm::gloo_backend
