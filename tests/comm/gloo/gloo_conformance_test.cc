// The backend conformance suite, instantiated for the Gloo backend (host memory, never skipped),
// with and without its eager ring, and with every size on the same-host single copy.
#include "comm/gloo/gloo_communicator.h"
#include "tests/comm/conformance/conformance.h"

namespace {

weightcast::testing::BackendSpec gloo_spec() {
  return weightcast::testing::host_backend("gloo", [](const weightcast::comm::CommOptions& o) {
    return std::unique_ptr<weightcast::comm::Communicator>(
        weightcast::comm::create_gloo_communicator(o));
  });
}

// The same suite with the eager ring off, so the chain over Gloo unbound buffers is held to it at
// every size (with the ring on, the suite's buffers are all small enough for the ring).
weightcast::testing::BackendSpec gloo_unbound_spec() {
  return weightcast::testing::host_backend("gloo_unbound", [](weightcast::comm::CommOptions o) {
    o.gloo.eager_ring.max_bytes = 0;
    return std::unique_ptr<weightcast::comm::Communicator>(
        weightcast::comm::create_gloo_communicator(o));
  });
}

// The same suite with every non-empty broadcast copied out of the root's memory (the suite's ranks
// are threads of one process, so the group agrees on single copy): its sizes, roots, misuse,
// abort and timeout cases then all run through comm/transport/single_copy.h.
weightcast::testing::BackendSpec gloo_single_copy_spec() {
  return weightcast::testing::host_backend("gloo_copy", [](weightcast::comm::CommOptions o) {
    o.gloo.single_copy.min_bytes = 1;
    return std::unique_ptr<weightcast::comm::Communicator>(
        weightcast::comm::create_gloo_communicator(o));
  });
}

}  // namespace

WC_INSTANTIATE_CONFORMANCE(Gloo, gloo_spec());
WC_INSTANTIATE_CONFORMANCE(GlooUnbound, gloo_unbound_spec());
WC_INSTANTIATE_CONFORMANCE(GlooSingleCopy, gloo_single_copy_spec());
