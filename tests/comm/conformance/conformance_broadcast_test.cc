// Broadcast delivers the root's bytes to every rank: every world size, root and size class.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/comm/conformance/conformance.h"
#include "tests/comm/conformance/conformance_support.h"

namespace weightcast::testing {

int broadcast_tests_anchor() {
  return 1;
}

namespace {

std::vector<std::uint8_t> poisoned(const std::vector<std::uint8_t>& want) {
  // Every byte differs from the expected one, so a chunk never written cannot pass by chance.
  std::vector<std::uint8_t> out(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) out[i] = static_cast<std::uint8_t>(~want[i]);
  return out;
}

}  // namespace

TEST_P(CommBroadcastConformance, EveryRankGetsTheRootsBytes) {
  const BroadcastCase& c = GetParam();
  const BackendSpec& spec = *c.backend;
  if (const std::string why = spec.skip_reason ? spec.skip_reason(c.world_size) : "";
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  const std::string name = spec.name + "/" + c.label;
  const std::uint64_t seed = seed_of(name);
  SCOPED_TRACE("case " + name + ", data seed " + std::to_string(seed));
  const std::vector<std::uint8_t> want = random_bytes(c.bytes, seed);
  auto store = case_store(name);

  std::vector<std::vector<std::uint8_t>> got(static_cast<std::size_t>(c.world_size));
  auto errors = run_ranks(c.world_size, [&](int rank) {
    comm::CommOptions opts = rank_options(spec, store, rank, c.world_size);
    auto communicator = spec.create(opts);
    RankBuffer buf(spec, c.bytes);
    buf.upload(rank == c.root ? want : poisoned(want));
    comm::BroadcastOptions b;
    // Zero bytes may come with a null buffer; exercise that path.
    b.buffer = c.bytes == 0 ? nullptr : buf.get();
    b.bytes = c.bytes;
    b.root = c.root;
    b.memory = spec.memory;
    communicator->broadcast(b);
    got[static_cast<std::size_t>(rank)] = buf.download();
    if (communicator->aborted()) throw std::runtime_error("aborted() after a good broadcast");
  });
  expect_no_rank_errors(errors);
  for (int r = 0; r < c.world_size; ++r) {
    const long at = first_mismatch(got[static_cast<std::size_t>(r)], want);
    EXPECT_EQ(at, -1) << "rank " << r << " (root " << c.root << ") differs from the root's "
                      << c.bytes << " bytes first at byte " << at;
  }
}

}  // namespace weightcast::testing
