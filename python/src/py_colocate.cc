#include "py_colocate.h"

#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "comm/colocate/segment.h"
#include "comm/colocate/segment_server.h"
#include "comm/device_memory.h"
#include "comm/errors.h"
#include "comm/host_identity.h"

namespace py = pybind11;

namespace weightcast::python {
namespace {

// One bucket: its bytes in a segment, and the server that hands the segment out.
class ColocatedBucket {
 public:
  explicit ColocatedBucket(const py::buffer& bytes) {
    const py::buffer_info info = bytes.request();
    const auto size = static_cast<std::size_t>(info.size * info.itemsize);
    if (size == 0) throw comm::ConfigError("a colocated bucket needs at least one byte");
    segment_ = std::make_unique<comm::colocate::SharedSegment>(size);
    std::memcpy(segment_->bytes().data(), info.ptr, size);
  }

  const std::string& socket() const { return server_.name(); }
  std::size_t size() const { return segment_->size(); }

  // Hands the segment with `token` to `connections` engine ranks within `timeout` seconds.
  void serve(const std::string& token, int connections, double timeout) {
    if (!(timeout > 0) || !std::isfinite(timeout)) {
      throw comm::ConfigError("timeout must be a positive number of seconds");
    }
    const auto deadline =
        comm::deadline_after(comm::Millis(static_cast<std::int64_t>(std::ceil(timeout * 1000.0))));
    py::gil_scoped_release nogil;
    server_.serve(token, segment_->reader_fd(), segment_->size(), connections, deadline);
  }

 private:
  std::unique_ptr<comm::colocate::SharedSegment> segment_;
  comm::colocate::SegmentServer server_;
};

}  // namespace

void bind_colocate(py::module_& m) {
  m.def(
      "_cuda_device_count", [] { return comm::cuda_device_count(); },
      "CUDA devices weightcast itself can use (0 in a build without CUDA): what "
      "colocate_memory='cuda' needs, whatever torch was built with.");
  py::class_<ColocatedBucket>(m, "_ColocatedBucket",
                              "One bucket in a sealed memfd segment, served on an abstract unix "
                              "socket with a session token (docs/colocated.md).")
      .def(py::init<const py::buffer&>(), py::arg("bytes"))
      .def_property_readonly("socket", &ColocatedBucket::socket)
      .def_property_readonly("size", &ColocatedBucket::size)
      .def("serve", &ColocatedBucket::serve, py::arg("token"), py::arg("connections"),
           py::arg("timeout") = 30.0);
  m.def("host_identity", &comm::host_identity,
        "This process's host identity (comm/host_identity.h): an engine reports it as /server_info "
        "colocate_host, so trainers with the same one send it colocated buckets.");
}

}  // namespace weightcast::python
