// Helpers of the colocated path's engine tests (http_colocate_test.cc, colocate_process_test.cc):
// the request body in weightcast's segment form, and the count of names in /dev/shm.
#pragma once

#include <dirent.h>

#include <sys/types.h>

#include <cstddef>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sync/engine/runners/runner.h"
#include "sync/model/checksum.h"
#include "sync/protocol/selector.h"
#include "tests/support/dev_shm.h"

namespace weightcast::sync::engine::testing {

// POST /update_weights_from_tensor for `tensors` at `offsets` of the segment served on `socket`
// (`size` bytes), with their digests, in `session`.
inline std::string segment_body(const std::vector<RawTensor>& tensors,
                                const std::vector<std::size_t>& offsets, const std::string& socket,
                                std::size_t size, const std::string& session,
                                Selector selector = Selector::kTarget) {
  nlohmann::json manifest = nlohmann::json::array(), digests = nlohmann::json::array();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    manifest.push_back({{"name", tensors[i].meta.name},
                        {"dtype", std::string(to_string(tensors[i].meta.dtype))},
                        {"shape", tensors[i].meta.shape},
                        {"offset", offsets[i]}});
    digests.push_back(to_string(tensor_digest(tensors[i].bytes)));
  }
  return nlohmann::json{{"load_format", "weightcast_segment"},
                        {"segment", {{"socket", socket}, {"size", size}}},
                        {"manifest", manifest},
                        {"digests", digests},
                        {"selector", std::string(to_string(selector))},
                        {"session_id", session}}
      .dump();
}

// Entries in /dev/shm (not other tests'): a colocated update must leave none behind.
inline std::size_t shm_entries() {
  return weightcast::testing::dev_shm_names().size();
}

// Mappings of weightcast's memfd segments in process `pid` (/proc/PID/maps): an engine keeps the
// trainer's between updates (comm/colocate/segment_mappings.h), and none once the trainer died.
inline std::size_t mapped_segments(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);) {
    // A trainer's arena (sync/trainer/tensor_arena.cc) or a sender's bucket segment
    // (colocated_sender.cc); not the engine's own memfds (the same-host control page).
    if (line.find("/memfd:weightcast-arena") != std::string::npos ||
        line.find("/memfd:weightcast-bucket") != std::string::npos) {
      ++count;
    }
  }
  return count;
}

}  // namespace weightcast::sync::engine::testing
