// The Python exceptions of the weightcast module and the translation of C++ errors into them.
//
//   Error(Exception)                      any weightcast failure (comm::Error)
//   ConfigError(Error)                    options the engines or this build cannot honour
//   InputError(Error, ValueError, TypeError)  a bad (name, tensor) pair; nothing was sent
//   TimeoutError(Error, TimeoutError)     a deadline passed
//   PeerError(Error, ConnectionError)     a peer failed (names it: .peer)
//   UpdateError(Error)                    update() failed and was aborted (.report)
//   EngineError(UpdateError, PeerError)   ... and an engine is to blame (.engine, .route)
//   EngineTimeoutError(EngineError, TimeoutError)  ... because that engine did not answer in time
//   VerifyError(Error)                    engines hold other bytes than were sent (.problems)
// C++ code throws InputFailure / UpdateFailure / VerifyFailure (below) or the comm:: and
// sync::trainer error types; the translator registered by register_errors() maps each to its
// Python class, so no C++ exception crosses into Python untranslated.
// Lifetime: the classes live as long as the interpreter. Threading: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "sync/trainer/report.h"

namespace weightcast::python {

// A bad item in update()'s input: raised as weightcast.InputError.
class InputFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failed (and aborted) update: raised as UpdateError, EngineError or EngineTimeoutError with
// the report attached.
class UpdateFailure : public std::runtime_error {
 public:
  explicit UpdateFailure(sync::trainer::UpdateReport report);
  const sync::trainer::UpdateReport& report() const { return report_; }

 private:
  sync::trainer::UpdateReport report_;
};

// Verification found differences: raised as VerifyError with one line per problem.
class VerifyFailure : public std::runtime_error {
 public:
  explicit VerifyFailure(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

// Creates the exception classes in `m` and registers the translator.
void register_errors(pybind11::module_& m);

}  // namespace weightcast::python
