#include "sync/engine/commit/tensor_routes.h"

#include "comm/errors.h"

namespace weightcast::sync::engine {

std::vector<std::vector<Runner>> route_tensors(const std::vector<ReceiverRunner>& runners,
                                               const LocalRanks& ranks, Selector selector,
                                               const std::vector<TensorMeta>& tensors,
                                               const std::unordered_set<std::string>& sent,
                                               std::uint64_t& dropped) {
  std::vector<std::vector<Runner>> destinations;
  destinations.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorMeta& meta = tensors[i];
    if (sent.count(meta.name)) {
      throw ReceiverError(400, "names[" + std::to_string(i) + "]: '" + meta.name +
                                   "' was already sent in this session");
    }
    std::vector<Runner> dest;
    for (const auto& r : runners) {
      if (!covers(selector, r.id) || !r.filter.accepts(meta.name)) continue;
      if (ranks.drops(meta.name)) {
        ++dropped;
        break;  // another rank's expert: no runner of this rank loads it
      }
      if (r.check) {
        if (auto why = r.check(meta)) {
          throw ReceiverError(400, "names[" + std::to_string(i) + "]: " + *why);
        }
      }
      dest.push_back(r.id);
    }
    destinations.push_back(std::move(dest));
  }
  return destinations;
}

std::vector<Digest> parse_expected_digests(const std::vector<std::string>& digests) {
  std::vector<Digest> expected;
  expected.reserve(digests.size());
  try {
    for (const auto& d : digests) expected.push_back(parse_digest(d, "digests"));
  } catch (const comm::BadRequestError& e) {
    throw ReceiverError(400, e.what());
  }
  return expected;
}

}  // namespace weightcast::sync::engine
