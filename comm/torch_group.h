// torch-compatible groups: the key chains torch's entry points put in front of a group's store
// keys, so a weightcast member reads and writes exactly the keys a torch member of the same group
// does (docs/interop.md lists each chain with its upstream source).
//
// A group with torch members is formed the usual way, create_communicator(backend, opts), with
//   opts.store            = torch_group_store(c10d_store, group_name, backend, keys)
//   opts.torch_compatible = true
// Gloo then rendezvouses under ProcessGroupGloo's per-device prefix and broadcasts with
// gloo::broadcast and ProcessGroupGloo's tag sequence (one tag per collective, from 0), so each
// dist.broadcast(tensor, src) on a torch member meets one broadcast() here. NCCL puts the unique
// id under ProcessGroupNCCL's key for the group's first communicator ("0").
// Stateless functions; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "comm/store.h"

namespace weightcast::comm {

// Which torch generation's key chain a group uses.
enum class TorchKeys {
  kTorch1,  // torch 1.x: "<group>/<group>/<k>" (gloo adds "0/" per device inside)
  kTorch2,  // torch 2.x: "<group>/<group>//<device>//<k>", device "cpu" (gloo) or "cuda" (nccl)
};

std::string_view to_string(TorchKeys keys);

// The store a member of the custom group `group_name` uses, as SGLang's
// init_custom_process_group and Miles' copy of it build it: PrefixStore(group_name) around the
// rendezvous store, then torch's _new_process_group_helper prefixes (group name, and on 2.x the
// device). `base` is normally a C10dStore (which adds torch's leading "/" on the wire).
// Throws EnforceError for an empty group name or a backend other than "gloo"/"nccl".
std::shared_ptr<Store> torch_group_store(std::shared_ptr<Store> base, std::string_view group_name,
                                         std::string_view backend, TorchKeys keys);

// The key under which ProcessGroupNCCL publishes the ncclUniqueId of a group's n-th collective
// communicator (n = 0 for the first, which is the only one a weight-update group creates).
std::string torch_nccl_unique_id_key(int communicator_index);

// ProcessGroupGloo's prefix for device `index` of its device list (one device: "0").
std::string torch_gloo_device_prefix(int index);

}  // namespace weightcast::comm
