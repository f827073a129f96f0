#include "py_store.h"

#include <cstdint>
#include <memory>
#include <string>

#include "comm/store/c10d_store_server.h"

namespace py = pybind11;

namespace weightcast::python {

void bind_store(py::module_& m) {
  py::class_<comm::C10dStoreServer>(
      m, "_C10dStoreServer",
      "A torch.distributed.TCPStore-compatible server (both protocol generations) on "
      "bind_address:port (0: an ephemeral port), serving until stop(). torch clients connect "
      "with TCPStore(host, port, world_size, is_master=False).")
      .def(py::init([](const std::string& bind_address, std::uint16_t port) {
             comm::C10dStoreServerOptions opts;
             opts.bind_address = bind_address;
             opts.port = port;
             return std::make_unique<comm::C10dStoreServer>(opts);
           }),
           py::arg("bind_address") = "127.0.0.1", py::arg("port") = 0)
      .def_property_readonly("port", &comm::C10dStoreServer::port)
      .def("stop", &comm::C10dStoreServer::stop, py::call_guard<py::gil_scoped_release>(),
           "Closes every connection; idempotent.");
}

}  // namespace weightcast::python
