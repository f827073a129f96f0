#include "sync/trainer/tensors.h"

#include <cstring>

#include "comm/errors.h"

namespace weightcast::sync::trainer {

void write_tensor(const NamedTensor& t, std::span<std::byte> out) {
  WC_ENFORCE_EQ(out.size(), tensor_size(t), "bytes of tensor ", t.meta.name);
  if (t.view != nullptr) {
    pack_slice(t.view->full_meta, t.view->slice, t.view->full, out);
  } else if (!out.empty()) {
    std::memcpy(out.data(), t.bytes.data(), out.size());
  }
}

Digest digest_of(const NamedTensor& t) {
  if (t.digest != nullptr) return *t.digest;
  if (t.view != nullptr) return slice_digest(t.view->full_meta, t.view->slice, t.view->full);
  return tensor_digest(t.bytes);
}

}  // namespace weightcast::sync::trainer
