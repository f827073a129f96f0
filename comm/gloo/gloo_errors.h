// How Gloo's failures read, so they can be mapped onto weightcast's typed errors.
//
// Gloo reports every transport failure as gloo::IoException (or gloo::EnforceNotMet) with a text
// message; the message is the only way to tell a timeout from a peer that went away. The phrases
// live here, in one place, so a Gloo upgrade that rewords them is a one-file change (the
// conformance and process tests catch a mismatch: they require TimeoutError / PeerError).
// Internal to the gloo backend.
#pragma once

#include <string_view>

namespace weightcast::comm::gloo_backend {

// The failure is a deadline that passed (ours, passed to a Gloo wait, or Gloo's connect timeout).
bool is_gloo_timeout(std::string_view what);

// The failure was raised by this process tearing its own context down (after abort() or a local
// timeout), not by a peer.
bool is_local_teardown(std::string_view what);

}  // namespace weightcast::comm::gloo_backend
