#include "comm/torch_group.h"

#include "comm/errors.h"
#include "comm/store/prefix_store.h"

namespace weightcast::comm {

std::string_view to_string(TorchKeys keys) {
  return keys == TorchKeys::kTorch1 ? "torch1" : "torch2";
}

std::shared_ptr<Store> torch_group_store(std::shared_ptr<Store> base, std::string_view group_name,
                                         std::string_view backend, TorchKeys keys) {
  WC_ENFORCE(base != nullptr, "torch_group_store needs a store to wrap");
  WC_ENFORCE(!group_name.empty(), "torch group name must not be empty");
  WC_ENFORCE(backend == "gloo" || backend == "nccl",
             "torch group backend must be gloo or nccl, got '", backend, "'");
  const std::string group(group_name);
  // SGLang's init_custom_process_group: PrefixStore(group_name, rendezvous store).
  auto custom = std::make_shared<PrefixStore>(group, std::move(base));
  if (keys == TorchKeys::kTorch1) {
    // torch 1.x _new_process_group_helper: PrefixStore(group_name, store).
    return std::make_shared<PrefixStore>(group, std::move(custom));
  }
  // torch 2.x _new_process_group_helper: PrefixStore(f"{group_name}/", store), then one
  // PrefixStore(f"{device}/", ...) per backend device type.
  auto helper = std::make_shared<PrefixStore>(group + "/", std::move(custom));
  const std::string device = backend == "nccl" ? "cuda/" : "cpu/";
  return std::make_shared<PrefixStore>(device, std::move(helper));
}

std::string torch_nccl_unique_id_key(int communicator_index) {
  WC_ENFORCE_GE(communicator_index, 0, "NCCL communicator index");
  // ProcessGroupNCCL::broadcastUniqueNCCLID: std::to_string(ncclCommCounter_++).
  return std::to_string(communicator_index);
}

std::string torch_gloo_device_prefix(int index) {
  WC_ENFORCE_GE(index, 0, "gloo device index");
  // ProcessGroupGloo: ::gloo::rendezvous::PrefixStore(std::to_string(i), store) per device.
  return std::to_string(index);
}

}  // namespace weightcast::comm
