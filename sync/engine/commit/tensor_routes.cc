#include "sync/engine/commit/tensor_routes.h"

#include "comm/errors.h"

namespace weightcast::sync::engine {

namespace {

// `meta` as `r` holds it in full when it arrived as the slice `slices` names (else unchanged);
// a shape that is neither the full one nor that slice's is refused.
TensorMeta as_full(const ReceiverRunner& r, const TensorMeta& meta, const ShardPlan* slices,
                   std::size_t index) {
  const TensorSlice* slice = slices != nullptr ? slices->find(meta.name) : nullptr;
  if (slice == nullptr || slice->kind == TensorSlice::Kind::kReplicated || !r.shape_of) return meta;
  const auto where = "names[" + std::to_string(index) + "]: '" + meta.name + "'";
  if (slice->kind == TensorSlice::Kind::kAbsent) {
    throw ReceiverError(400, where + ": the shard plan of this group's ranks keeps none of it");
  }
  auto full_shape = r.shape_of(meta.name);
  if (!full_shape || meta.shape == *full_shape) return meta;
  TensorMeta full{meta.name, meta.dtype, std::move(*full_shape)};
  if (sliced_shape(full, *slice) != meta.shape) {
    throw ReceiverError(400, where +
                                 " arrives with a shape that is neither the runner's nor the "
                                 "slice " +
                                 describe(*slice) + " its shard plan keeps of it");
  }
  return full;
}

}  // namespace

std::vector<std::vector<Runner>> route_tensors(const std::vector<ReceiverRunner>& runners,
                                               const LocalRanks& ranks, Selector selector,
                                               const std::vector<TensorMeta>& tensors,
                                               const std::unordered_set<std::string>& sent,
                                               std::uint64_t& dropped, const ShardPlan* slices) {
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
        if (auto why = r.check(as_full(r, meta, slices, i))) {
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
