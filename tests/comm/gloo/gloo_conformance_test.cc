// The backend conformance suite, instantiated for the Gloo backend (host memory, never skipped).
#include "comm/gloo/gloo_communicator.h"
#include "tests/comm/conformance/conformance.h"

namespace {

weightcast::testing::BackendSpec gloo_spec() {
  return weightcast::testing::host_backend("gloo", [](const weightcast::comm::CommOptions& o) {
    return std::unique_ptr<weightcast::comm::Communicator>(
        weightcast::comm::create_gloo_communicator(o));
  });
}

}  // namespace

WC_INSTANTIATE_CONFORMANCE(Gloo, gloo_spec());
