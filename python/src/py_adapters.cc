#include "py_adapters.h"

#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "sync/model/model.h"
#include "sync/protocol/dtype.h"
#include "sync/protocol/protocol.h"

namespace weightcast::python {

namespace py = pybind11;
namespace se = sync::engine;

se::AdapterTarget parse_adapter_begin(const std::string& lora_json) {
  try {
    // The route's own parser reads the object, so both ends refuse the same bodies alike.
    const auto lora = nlohmann::json::parse(lora_json);
    const nlohmann::json body = {{"selector", "target"}, {"lora", lora}};
    const auto begin = sync::parse_begin_weight_update(body.dump());
    return se::adapter_target(*begin.lora);
  } catch (const nlohmann::json::exception&) {
    throw se::ReceiverError(400, "lora: not a JSON object {lora_name, config, op}");
  } catch (const comm::BadRequestError& e) {
    throw se::ReceiverError(400, e.what());
  }
}

namespace {

// An adapter as Python reads it: its config and its tensors (copies: an adapter is small, and a
// copy outlives an unload).
py::object adapter_dict(const std::shared_ptr<const se::Adapter>& a) {
  if (!a) return py::none();
  py::dict d;
  d["lora_name"] = a->name;
  d["version"] = a->version;
  d["r"] = a->config.r;
  d["lora_alpha"] = a->config.lora_alpha;
  d["scaling"] = a->config.scaling();
  d["target_modules"] = a->config.target_modules;
  py::list tensors;
  for (std::size_t i = 0; i < a->tensors.size(); ++i) {
    const auto& t = a->tensors[i];
    const auto& bytes = a->bytes[i];
    tensors.append(
        py::make_tuple(t.name, std::string(sync::to_string(t.dtype)), py::cast(t.shape),
                       py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  }
  d["tensors"] = tensors;
  return d;
}

}  // namespace

void bind_receiver_adapters(py::module_& m, py::class_<se::Receiver>& cls) {
  m.def(
      "_fill_tensor",
      [](const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape,
         std::uint64_t seed, std::uint64_t step) {
        const sync::TensorMeta meta{name,
                                    [&] {
                                      try {
                                        return sync::parse_dtype(dtype);
                                      } catch (const comm::BadRequestError& e) {
                                        throw se::ReceiverError(400, e.what());
                                      }
                                    }(),
                                    std::move(shape)};
        std::string out(meta.byte_count(), '\0');
        sync::fill_tensor(
            meta, seed, step,
            std::span<std::byte>(reinterpret_cast<std::byte*>(out.data()), out.size()));
        return py::bytes(out);
      },
      py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("seed"), py::arg("step"));
  cls.def(
         "adapter",
         [](const se::Receiver& r, const std::string& name) {
           return adapter_dict(r.adapters().find(name));
         },
         py::arg("name"))
      .def("adapter_names", [](const se::Receiver& r) { return r.adapters().names(); })
      .def("unload_adapter", &se::Receiver::unload_adapter, py::arg("name"))
      .def(
          "adapter_checksum",
          [](const se::Receiver& r, const std::string& name) -> py::object {
            const auto a = r.adapters().find(name);
            if (!a) return py::none();
            return py::str(se::adapter_checksum_json(*a));
          },
          py::arg("name"));
}

}  // namespace weightcast::python
