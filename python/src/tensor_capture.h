// CapturedTensors: the (name, tensor) pairs handed to update(), as NamedTensor views of the
// caller's own memory, so no weight byte is copied on the way in.
//
// Accepted values: objects with data_ptr(), dtype, shape and is_contiguous() (torch tensors; the
// dtype is matched by name, bfloat16 included) and objects exposing the buffer protocol (numpy
// arrays, memoryview, bytes). Contiguous host memory is read in place; a non-contiguous tensor is
// copied once (tensor.contiguous() / PyBuffer_ToContiguous), a device tensor once to host
// (tensor.cpu()). Anything else, an unsupported dtype, a bad or duplicate name raises
// InputFailure naming the item, before any engine is contacted.
// Lifetime: holds a reference to every tensor (and its buffer export, which makes numpy refuse a
// resize) until destroyed, so the views stay valid however the caller drops its own references.
// Threading: capture(), changed() and the destructor need the GIL; views() may be read from
// any thread without it.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sync/trainer/tensors.h"

namespace weightcast::python {

class CapturedTensors {
 public:
  // Consumes `named_tensors`: an iterable of (name, tensor) pairs, or a mapping (its items()).
  static CapturedTensors capture(pybind11::handle named_tensors);
  CapturedTensors() = default;
  ~CapturedTensors();
  CapturedTensors(CapturedTensors&&) noexcept = default;
  CapturedTensors& operator=(CapturedTensors&&) noexcept = default;

  const std::vector<sync::trainer::NamedTensor>& views() const { return views_; }

  // The first tensor read in place whose data pointer, shape or version counter differ from
  // what was captured (resized, re-pointed or modified in place meanwhile); nullopt if none.
  std::optional<std::string> changed() const;
  // Tensor `name` was written by its producer after capture (send_stage()'s await_tensor: bytes
  // still arriving when captured): its current version counter becomes the one changed() checks.
  // Needs the GIL.
  void written(const std::string& name);

 private:
  struct Fingerprint {
    std::size_t index = 0;  // into views_
    pybind11::object tensor;
    std::uintptr_t data_ptr = 0;
    pybind11::object shape;
    std::optional<std::int64_t> version;
  };
  struct BufferRelease {
    void operator()(Py_buffer* view) const;
  };

  void add(pybind11::handle name, pybind11::handle value, std::size_t item);
  void add_tensor_like(sync::TensorMeta meta, pybind11::object tensor, std::size_t item);
  void add_buffer(sync::TensorMeta meta, pybind11::handle value, std::size_t item);

  std::vector<sync::trainer::NamedTensor> views_;
  std::vector<pybind11::object> keep_;  // tensors and the copies made of them
  std::vector<std::unique_ptr<Py_buffer, BufferRelease>> buffers_;
  std::vector<std::unique_ptr<std::byte[]>> copies_;  // non-contiguous buffers
  std::vector<Fingerprint> fingerprints_;
  std::unordered_map<std::string, std::size_t> fingerprint_of_;  // name -> index in fingerprints_
};

}  // namespace weightcast::python
