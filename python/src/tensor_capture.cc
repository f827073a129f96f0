#include "tensor_capture.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "comm/errors.h"
#include "errors.h"
#include "sync/protocol/dtype.h"

namespace py = pybind11;

namespace weightcast::python {

namespace {

std::string item_label(std::size_t item, const std::string& name) {
  return name.empty() ? "item " + std::to_string(item)
                      : "tensor '" + name + "' (item " + std::to_string(item) + ")";
}

std::string type_name(py::handle value) {
  return py::str(py::type::handle_of(value).attr("__name__"));
}

// The element type of a buffer-protocol format ("<f", "e", "B", ...), or nullopt.
std::optional<sync::DType> dtype_from_format(std::string_view format, Py_ssize_t itemsize) {
  if (!format.empty() && std::string_view("@=<|").find(format[0]) != std::string_view::npos) {
    format.remove_prefix(1);  // native or little endian (this is a little-endian build)
  }
  if (format.size() != 1) return std::nullopt;
  using enum sync::DType;
  // 'l' and 'q' are C long and long long: their size says which integer type they are.
  const sync::DType wide = itemsize == 4 ? kInt32 : kInt64;
  const std::pair<char, sync::DType> kFormats[] = {
      {'f', kFloat32}, {'d', kFloat64}, {'e', kFloat16}, {'b', kInt8}, {'B', kUInt8},
      {'h', kInt16},   {'i', kInt32},   {'l', wide},     {'q', wide},  {'?', kBool}};
  const auto* match = std::find_if(std::begin(kFormats), std::end(kFormats),
                                   [&](const auto& f) { return f.first == format[0]; });
  if (match == std::end(kFormats)) return std::nullopt;
  const sync::DType dtype = match->second;
  if (static_cast<Py_ssize_t>(sync::element_size(dtype)) != itemsize) return std::nullopt;
  return dtype;
}

bool is_tensor_like(py::handle value) {
  return py::hasattr(value, "data_ptr") && py::hasattr(value, "dtype") &&
         py::hasattr(value, "shape") && py::hasattr(value, "is_contiguous");
}

std::vector<std::int64_t> shape_of(py::handle shape) {
  std::vector<std::int64_t> out;
  for (py::handle d : shape) out.push_back(d.cast<std::int64_t>());
  return out;
}

}  // namespace

void CapturedTensors::BufferRelease::operator()(Py_buffer* view) const {
  PyBuffer_Release(view);
  delete view;
}

CapturedTensors::~CapturedTensors() = default;

CapturedTensors CapturedTensors::capture(py::handle named_tensors) {
  py::object items = py::reinterpret_borrow<py::object>(named_tensors);
  if (PyDict_Check(items.ptr()) || (py::hasattr(items, "items") && py::hasattr(items, "keys"))) {
    items = items.attr("items")();
  }
  if (!py::isinstance<py::iterable>(items)) {
    throw InputFailure("update() takes an iterable of (name, tensor) pairs or a mapping, got " +
                       type_name(items));
  }
  CapturedTensors out;
  std::unordered_map<std::string, std::size_t> seen;
  std::size_t item = 0;
  for (py::handle pair : items) {
    if (!py::isinstance<py::sequence>(pair) || py::isinstance<py::str>(pair) ||
        py::len(pair) != 2) {
      throw InputFailure(item_label(item, "") + ": expected a (name, tensor) pair, got " +
                         type_name(pair));
    }
    py::sequence seq = py::reinterpret_borrow<py::sequence>(pair);
    if (!py::isinstance<py::str>(seq[0])) {
      throw InputFailure(item_label(item, "") + ": the name must be a str, got " +
                         type_name(seq[0]));
    }
    const std::string name = seq[0].cast<std::string>();
    const auto [it, fresh] = seen.emplace(name, item);
    if (!fresh) {
      throw InputFailure("duplicate tensor name '" + name + "' (items " +
                         std::to_string(it->second) + " and " + std::to_string(item) + ")");
    }
    out.add(seq[0], seq[1], item);
    ++item;
  }
  return out;
}

void CapturedTensors::add(py::handle name, py::handle value, std::size_t item) {
  sync::TensorMeta meta;
  meta.name = name.cast<std::string>();
  const std::string label = item_label(item, meta.name);
  try {
    sync::validate_tensor_name(meta.name, "name");
    if (is_tensor_like(value)) {
      add_tensor_like(std::move(meta), py::reinterpret_borrow<py::object>(value), item);
    } else if (PyObject_CheckBuffer(value.ptr())) {
      add_buffer(std::move(meta), value, item);
    } else {
      throw InputFailure(
          "expected a tensor (data_ptr/dtype/shape) or a buffer such as a numpy "
          "array, got " +
          type_name(value));
    }
  } catch (const InputFailure& e) {
    throw InputFailure(label + ": " + e.what());
  } catch (const comm::BadRequestError& e) {
    throw InputFailure(label + ": " + e.what());
  } catch (py::error_already_set& e) {
    throw InputFailure(label + ": " + e.what());
  }
}

void CapturedTensors::add_tensor_like(sync::TensorMeta meta, py::object tensor, std::size_t) {
  const std::string dtype_text = py::str(tensor.attr("dtype"));
  try {
    meta.dtype = sync::parse_dtype(dtype_text);
  } catch (const comm::BadRequestError&) {
    throw InputFailure("dtype " + dtype_text +
                       " is not supported (float32, float16, bfloat16, "
                       "float64, float8_e4m3fn, float8_e5m2, int8, uint8, int16, int32, int64, "
                       "bool)");
  }
  bool copied = false;
  if (py::hasattr(tensor, "device") &&
      py::str(tensor.attr("device").attr("type")).cast<std::string>() != "cpu") {
    tensor = tensor.attr("cpu")();  // one copy to host: the bucket path reads host memory
    copied = true;
  }
  if (!tensor.attr("is_contiguous")().cast<bool>()) {
    tensor = tensor.attr("contiguous")();  // one copy, kept alive below
    copied = true;
  }
  meta.shape = shape_of(tensor.attr("shape"));
  sync::validate(meta);
  const std::size_t bytes = meta.byte_count();
  if (py::hasattr(tensor, "element_size") &&
      tensor.attr("element_size")().cast<std::size_t>() != sync::element_size(meta.dtype)) {
    throw InputFailure("element size disagrees with dtype " + dtype_text);
  }
  const auto ptr = tensor.attr("data_ptr")().cast<std::uintptr_t>();
  if (ptr == 0 && bytes != 0) throw InputFailure("data_ptr() is null");
  views_.push_back({std::move(meta), {reinterpret_cast<const std::byte*>(ptr), bytes}});
  if (!copied) {
    Fingerprint f{views_.size() - 1, tensor, ptr, py::tuple(tensor.attr("shape")), std::nullopt};
    if (py::hasattr(tensor, "_version")) f.version = tensor.attr("_version").cast<std::int64_t>();
    fingerprint_of_.emplace(views_.back().meta.name, fingerprints_.size());
    fingerprints_.push_back(std::move(f));
  }
  keep_.push_back(std::move(tensor));
}

void CapturedTensors::add_buffer(sync::TensorMeta meta, py::handle value, std::size_t) {
  std::unique_ptr<Py_buffer, BufferRelease> view(new Py_buffer{});
  if (PyObject_GetBuffer(value.ptr(), view.get(), PyBUF_RECORDS_RO) != 0) {
    delete view.release();
    throw py::error_already_set();
  }
  const char* format = view->format != nullptr ? view->format : "B";
  const auto dtype = dtype_from_format(format, view->itemsize);
  if (!dtype) {
    throw InputFailure(std::string("buffer format '") + format + "' (item size " +
                       std::to_string(view->itemsize) + ") is not a supported dtype");
  }
  meta.dtype = *dtype;
  for (int d = 0; d < view->ndim; ++d) meta.shape.push_back(view->shape[d]);
  sync::validate(meta);
  const std::size_t bytes = meta.byte_count();
  if (static_cast<std::size_t>(view->len) != bytes) throw InputFailure("buffer length mismatch");
  const std::byte* data = static_cast<const std::byte*>(view->buf);
  if (!PyBuffer_IsContiguous(view.get(), 'C')) {
    auto copy = std::make_unique<std::byte[]>(bytes);
    if (PyBuffer_ToContiguous(copy.get(), view.get(), view->len, 'C') != 0) {
      throw py::error_already_set();
    }
    data = copy.get();
    copies_.push_back(std::move(copy));
    view.reset();  // the copy is ours; the export is not needed any more
  } else {
    buffers_.push_back(std::move(view));
  }
  views_.push_back({std::move(meta), {data, bytes}});
}

void CapturedTensors::written(const std::string& name) {
  const auto it = fingerprint_of_.find(name);
  if (it == fingerprint_of_.end()) return;  // copied at capture: nothing read in place
  Fingerprint& f = fingerprints_[it->second];
  if (f.version) f.version = f.tensor.attr("_version").cast<std::int64_t>();
}

std::optional<std::string> CapturedTensors::changed() const {
  for (const auto& f : fingerprints_) {
    const auto ptr = f.tensor.attr("data_ptr")().cast<std::uintptr_t>();
    const bool same_shape = py::tuple(f.tensor.attr("shape")).equal(f.shape);
    bool same_version = true;
    if (f.version) same_version = f.tensor.attr("_version").cast<std::int64_t>() == *f.version;
    if (ptr != f.data_ptr || !same_shape || !same_version) {
      return views_[f.index].meta.name;
    }
  }
  return std::nullopt;
}

}  // namespace weightcast::python
