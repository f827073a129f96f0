// Errors raised by weightcast.
//
// Two tiers, as in Gloo. Misuse of an API (a null buffer, a root outside the group) is a bug in
// the caller: WC_ENFORCE* throw EnforceError with both values and file:line. Failures a caller
// can recover from are typed: TimeoutError (a deadline passed), PeerError (a peer closed, reset or
// misbehaved; names the peer), ConfigError (bad options or an environment that cannot honour
// them), BadRequestError (malformed input from the outside). All derive from Error.
// docs/errors.md says what state each one leaves behind.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace weightcast::comm {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Programming error in the caller. Never caught inside weightcast.
class EnforceError : public Error {
 public:
  using Error::Error;
};

// A deadline passed. The object that timed out (communicator, store client) is aborted.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer failed: connection closed or reset, protocol violation, rank missing. `peer` names it
// ("rank 3 (127.0.0.1:4711)", "engine http://host:port", ...).
class PeerError : public Error {
 public:
  PeerError(std::string peer, const std::string& what)
      : Error(what + " [peer: " + peer + "]"), peer_(std::move(peer)) {}
  const std::string& peer() const noexcept { return peer_; }

 private:
  std::string peer_;
};

// Options or environment that cannot be honoured (backend not built, no GPU, bad address).
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Malformed input from outside the process (HTTP body, store frame). Names the field.
class BadRequestError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename A, typename B>
[[noreturn]] void enforce_fail(const char* file, int line, const char* expr, const A& a,
                               const B& b, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": enforce failed: " << expr << " (" << a << " vs. " << b << ")";
  if (!msg.empty()) os << ": " << msg;
  throw EnforceError(os.str());
}
[[noreturn]] void enforce_fail(const char* file, int line, const char* expr,
                               const std::string& msg);
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace weightcast::comm

#define WC_ENFORCE(cond, ...)                                                           \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      ::weightcast::comm::detail::enforce_fail(__FILE__, __LINE__, #cond,               \
                                               ::weightcast::comm::detail::concat(      \
                                                   "" __VA_OPT__(, ) __VA_ARGS__));     \
    }                                                                                   \
  } while (false)

#define WC_ENFORCE_OP_(a, b, op, ...)                                                   \
  do {                                                                                  \
    const auto& wc_a_ = (a);                                                            \
    const auto& wc_b_ = (b);                                                            \
    if (!(wc_a_ op wc_b_)) {                                                            \
      ::weightcast::comm::detail::enforce_fail(__FILE__, __LINE__, #a " " #op " " #b,   \
                                               wc_a_, wc_b_,                            \
                                               ::weightcast::comm::detail::concat(      \
                                                   "" __VA_OPT__(, ) __VA_ARGS__));     \
    }                                                                                   \
  } while (false)

#define WC_ENFORCE_EQ(a, b, ...) WC_ENFORCE_OP_(a, b, ==, __VA_ARGS__)
#define WC_ENFORCE_NE(a, b, ...) WC_ENFORCE_OP_(a, b, !=, __VA_ARGS__)
#define WC_ENFORCE_LT(a, b, ...) WC_ENFORCE_OP_(a, b, <, __VA_ARGS__)
#define WC_ENFORCE_LE(a, b, ...) WC_ENFORCE_OP_(a, b, <=, __VA_ARGS__)
#define WC_ENFORCE_GT(a, b, ...) WC_ENFORCE_OP_(a, b, >, __VA_ARGS__)
#define WC_ENFORCE_GE(a, b, ...) WC_ENFORCE_OP_(a, b, >=, __VA_ARGS__)
