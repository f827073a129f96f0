// How a broadcast on the ring's links fails, shared by the transports (comm/transport/) and the
// algorithms over them (comm/algorithms/): a failed link, or a wait cut short by an interrupt.
#pragma once

#include <string>

namespace weightcast::comm::gloo_backend {

// A Gloo call on the link to `peer` failed; `gloo_what` is Gloo's message, `doing` says what the
// chain was doing ("receiving chunk 3/10 from rank 1"). `peer_gone`: the chain still needed data
// on a link whose connection had already failed (a PeerError whatever Gloo's wording).
// `timed_out`: the collective's deadline passed (the eager ring's own timeouts; Gloo's are told by
// their wording).
struct LinkFailure {
  int peer = -1;
  std::string doing;
  std::string gloo_what;
  bool peer_gone = false;
  bool timed_out = false;
};

// A wait returned because wake_all() was called: the communicator is failing or aborted.
struct WaitInterrupted {};

}  // namespace weightcast::comm::gloo_backend
