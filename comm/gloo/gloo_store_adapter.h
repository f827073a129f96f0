// GlooStoreAdapter: presents a weightcast Store to Gloo's rendezvous (gloo::rendezvous::Store), so
// pair addresses travel through our store (memory, TCP, token-authenticated, prefix-scoped).
//
// The whole rendezvous shares one deadline, fixed at construction: Gloo waits key by key, and
// without a shared deadline a group missing a rank would take (size - 1) timeouts to fail. Both
// of Gloo's wait overloads are honoured; the one without a timeout uses what is left of the
// deadline. A wait that runs out throws our TimeoutError naming the keys (Gloo keys are ranks).
// Lifetime: lives on the stack of create_gloo_communicator(). Threading: one thread.
// Internal to the gloo backend; includes Gloo headers.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/store.h"

namespace weightcast::comm::gloo_backend {

class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, Millis timeout, std::string who);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  // Time a single store call may take: `requested` capped by the rendezvous deadline, never zero
  // (a zero timeout reads as "no time at all" to some stores and as "forever" to others).
  Millis budget(Millis requested) const;
  [[noreturn]] void rethrow_timeout(const std::vector<std::string>& keys,
                                    const std::exception& e) const;

  std::shared_ptr<comm::Store> store_;
  Millis timeout_;
  Deadline deadline_;
  std::string who_;  // "rank 1 of 4", for messages
};

}  // namespace weightcast::comm::gloo_backend
