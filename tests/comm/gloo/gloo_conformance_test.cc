// The backend conformance suite, instantiated for the Gloo backend (host memory, never skipped),
// with and without its eager ring.
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
    o.eager_max_bytes = 0;
    return std::unique_ptr<weightcast::comm::Communicator>(
        weightcast::comm::create_gloo_communicator(o));
  });
}

}  // namespace

WC_INSTANTIATE_CONFORMANCE(Gloo, gloo_spec());
WC_INSTANTIATE_CONFORMANCE(GlooUnbound, gloo_unbound_spec());
