#include "py_session.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "comm/errors.h"
#include "sync/engine/commit/receiver_loader.h"
#include "sync/engine/control/session.h"
#include "sync/protocol/selector.h"

namespace py = pybind11;
namespace se = weightcast::sync::engine;

namespace weightcast::python {
namespace {

using Token = std::optional<std::string>;

// A refusal raises weightcast.ReceiverError (.status), as the Receiver's own do.
void raise_if(const std::optional<se::Refusal>& refusal) {
  if (refusal) throw se::ReceiverError(refusal->status, refusal->message);
}

sync::Selector selector_of(const std::string& text) {
  try {
    return sync::parse_selector(text);
  } catch (const comm::BadRequestError& e) {
    throw se::ReceiverError(400, e.what());
  }
}

void bind_checks(py::class_<se::SessionMachine>& cls) {
  cls.def(
         "check_open",
         [](const se::SessionMachine& s, Token token, const std::string& route) {
           raise_if(s.check_open(token, route));
         },
         py::arg("token"), py::arg("route"))
      .def(
          "check_owner",
          [](const se::SessionMachine& s, Token token, const std::string& route) {
            raise_if(s.check_owner(token, route));
          },
          py::arg("token"), py::arg("route"))
      .def("check_payload",
           [](const se::SessionMachine& s, const std::string& selector) {
             raise_if(s.check_payload(selector_of(selector)));
           })
      .def("check_end", [](const se::SessionMachine& s) { raise_if(s.check_end()); });
}

void bind_state(py::class_<se::SessionMachine>& cls) {
  cls.def_property_readonly("in_session", &se::SessionMachine::in_session)
      .def_property_readonly("selector",
                             [](const se::SessionMachine& s) -> Token {
                               if (!s.selector()) return std::nullopt;
                               return std::string(sync::to_string(*s.selector()));
                             })
      .def_property_readonly("token", &se::SessionMachine::token)
      .def_property_readonly("holder_text", &se::SessionMachine::holder_text)
      .def_property_readonly("owned", &se::SessionMachine::owned)
      .def_property_readonly("sessionless", &se::SessionMachine::sessionless)
      .def_property_readonly("session_id", &se::SessionMachine::session_id)
      .def_property_readonly("pending_version", &se::SessionMachine::pending_version)
      .def_property("paused", &se::SessionMachine::paused, &se::SessionMachine::set_paused);
}

}  // namespace

void bind_session_machine(py::module_& m) {
  py::class_<se::SessionMachine> cls(
      m, "SessionMachine",
      "The update session's rules (begin, owner, payload, end, abort) as weightcast-engine keeps "
      "them; a refusal raises ReceiverError with its HTTP status.");
  cls.def(py::init<>())
      .def(
          "begin",
          [](se::SessionMachine& s, const std::string& selector, Token holder, bool sessionless) {
            raise_if(s.begin(selector_of(selector), std::move(holder), sessionless));
            return s.token();
          },
          py::arg("selector"), py::arg("holder") = py::none(), py::arg("sessionless") = false,
          "Opens a session; returns its token (the wire session_id).")
      .def("close", &se::SessionMachine::close, "Leaves the session; whether one was open.")
      .def("set_version", &se::SessionMachine::set_version,
           "Stages the version in a session (False), or says to apply it at once (True).");
  bind_checks(cls);
  bind_state(cls);
}

}  // namespace weightcast::python
