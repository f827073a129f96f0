// SessionMachine: the engine's update-session state, kept apart from HTTP so every transition is
// unit-testable without sockets.
//
// The one session state machine of the engine side: the Receiver owns it
// (sync/engine/commit/receiver.h); weightcast-engine's control plane and the Python engines reach
// it through the Receiver and its binding, and word no rule of their own.
// States: idle, or in a session that recorded its selector at begin. The paused flag (generation
// paused) is orthogonal. The rules (docs/protocol.md, "Session state machine"):
//   begin      idle -> in session(selector);         in session -> 409
//   payload    idle -> 409; in session(s), payload selector != s -> 409; else allowed
//   end        idle -> 409;                           in session -> idle (after commit)
//   abort      any -> idle (idempotent)
//   version    in session -> staged until commit;     idle -> applied at once
// A refused call returns the refusal and changes nothing. The session id grows by one per begin,
// so work queued for an old session can tell it is stale.
//
// Owners. Every begin also draws a random token (the wire "session_id", 128 bits from the OS
// CSPRNG as hex, compared in constant time: sync/engine/control/secret.h). A
// session whose begin named a holder is owned: check_owner() then lets a call through only when
// it carries that token, and refuses (409, naming the holder) calls with another token or none.
// A session begun without a holder (SGLang/Miles clients) is open to id-less calls, as before;
// a call carrying a token must still carry the right one. force (abort only) skips the check.
// Lifetime: owned by the Receiver. Threading: not synchronized; the Receiver holds its lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sync/engine/control/reply.h"
#include "sync/protocol/selector.h"

namespace weightcast::sync::engine {

class SessionMachine {
 public:
  bool in_session() const { return selector_.has_value(); }
  std::optional<Selector> selector() const { return selector_; }
  std::uint64_t session_id() const { return session_id_; }
  bool paused() const { return paused_; }
  const std::optional<std::string>& pending_version() const { return pending_version_; }
  bool flush_requested() const { return flush_requested_; }

  // `sessionless`: the one-request session the engine opens itself for an update request that
  // arrives with no session open (docs/protocol.md, "Sessionless updates"); no client holds it.
  std::optional<Refusal> begin(Selector selector, std::optional<std::string> holder = {},
                               bool sessionless = false);
  bool sessionless() const { return sessionless_; }
  // Whether a session call from `route` with `token` may act on the open session. Changes
  // nothing; with no session open it lets the call through (the route's own rule answers).
  std::optional<Refusal> check_owner(const std::optional<std::string>& token,
                                     std::string_view route) const;
  const std::string& token() const { return token_; }
  // "host:pid group ..." as begin named it, or "an unnamed client" for an unowned session.
  std::string holder_text() const;
  bool owned() const { return holder_.has_value(); }
  // Whether a call from `route` finds a session open: with none, the refusal says so, naming the
  // session_id the call carried (ended, aborted or timed out) or asking for a begin. Changes
  // nothing.
  std::optional<Refusal> check_open(const std::optional<std::string>& token,
                                    std::string_view route) const;
  // Whether a bucket with `selector` may be staged now. Changes nothing.
  std::optional<Refusal> check_payload(Selector selector) const;
  // Whether end may commit now. Changes nothing; close() finishes the transition.
  std::optional<Refusal> check_end() const;
  // Leaves the session (commit done, or abort/failure) and drops the staged version. Returns
  // whether a session was open.
  bool close();

  // In a session the version is staged for commit (returns false); idle, the caller applies it
  // at once (returns true).
  bool set_version(std::string version);
  // A bucket asked for a cache flush after commit (SGLang's flush_cache field).
  void request_flush() { flush_requested_ = true; }

  void set_paused(bool paused) { paused_ = paused; }

 private:
  std::optional<Selector> selector_;
  std::uint64_t session_id_ = 0;
  std::string token_;
  std::optional<std::string> holder_;
  bool sessionless_ = false;
  bool paused_ = false;
  std::optional<std::string> pending_version_;
  bool flush_requested_ = false;
};

}  // namespace weightcast::sync::engine
