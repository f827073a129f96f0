#include "comm/gloo/group_settings.h"

#include <array>
#include <string>
#include <vector>

#include "comm/errors.h"

namespace weightcast::comm::gloo_backend {
namespace {

// Every link of the chain cuts a broadcast into chunk_bytes pieces and the receiver posts buffers
// of its own chunk size; a larger incoming piece trips an enforce in Gloo's I/O thread, which
// terminates the receiving process. So a group must agree on the size: rank 0 publishes its own
// before the mesh forms, every other rank compares once the mesh formed (rank 0's key is then
// surely there) and refuses a difference, before it declares itself connected.
// The eager and single-copy thresholds are agreed the same way: members that disagree would wait
// on different transports or messages until the deadline.
struct GroupSetting {
  const char* key;
  const char* name;
  std::size_t (*field)(const CommOptions&);
};
constexpr std::array<GroupSetting, 3> kGroupSettings = {{
    {"chain/chunk_bytes", "chunk_bytes",
     [](const CommOptions& o) { return o.gloo.chain.chunk_bytes; }},
    {"chain/eager_max_bytes", "eager_max_bytes",
     [](const CommOptions& o) { return o.gloo.eager_ring.max_bytes; }},
    {"chain/single_copy_min_bytes", "single_copy_min_bytes",
     [](const CommOptions& o) { return o.gloo.single_copy.min_bytes; }},
}};

}  // namespace

void publish_group_settings(GlooStoreAdapter& store, const CommOptions& opts) {
  for (const auto& s : kGroupSettings) {
    const std::string text = std::to_string(s.field(opts));
    store.set(s.key, std::vector<char>(text.begin(), text.end()));
  }
}

void check_group_settings(GlooStoreAdapter& store, const CommOptions& opts) {
  for (const auto& s : kGroupSettings) {
    const std::vector<char> value = store.get(s.key);
    const std::string root(value.begin(), value.end());
    if (root != std::to_string(s.field(opts))) {
      throw ConfigError(detail::concat("gloo: rank 0 of the group uses ", s.name, " ", root,
                                       ", rank ", opts.rank, " uses ", s.field(opts),
                                       "; every member must use the same value"));
    }
  }
}

}  // namespace weightcast::comm::gloo_backend
