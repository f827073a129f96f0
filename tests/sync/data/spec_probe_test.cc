#include "sync/model/spec_probe.h"

#include <gtest/gtest.h>

#include <vector>

#include "comm/errors.h"
#include "sync/model/layout.h"
#include "sync/model/model.h"

namespace weightcast::sync {
namespace {

using Bytes = std::vector<std::byte>;

Bytes generate(const TensorMeta& m, std::uint64_t step) {
  Bytes b(m.byte_count());
  fill_tensor(m, /*seed=*/7, step, b);
  return b;
}

const TensorMeta* find(const std::vector<TensorMeta>& metas, const std::string& name) {
  for (const auto& m : metas) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

struct Probe {
  ModelSpec spec = model_preset("tiny");
  std::vector<TensorMeta> target = target_tensors(spec);
  std::vector<TensorMeta> draft = draft_tensors(spec);

  double run(std::uint64_t target_step, const Bytes& fc) {
    const TensorMeta* embed = find(target, "model.embed_tokens.weight");
    const TensorMeta* head = find(target, "lm_head.weight");
    Bytes e = generate(*embed, target_step), h = generate(*head, target_step);
    SpecProbeInput in{spec.dtype, spec.vocab_size, spec.hidden_size, e, h, fc};
    return run_spec_probe(in).accept_length;
  }
  Bytes draft_fc() { return generate(*find(draft, "draft.fc.weight"), 0); }
};

TEST(SpecProbe, CorrectDraftIsWellAboveOneAndStaysThereWhileTheTargetTrains) {
  Probe p;
  const double step0 = p.run(0, p.draft_fc());
  const double step5 = p.run(5, p.draft_fc());
  std::printf("accept length: step 0 %.2f, step 5 %.2f\n", step0, step5);
  EXPECT_GT(step0, 2.0);
  EXPECT_GT(step5, 2.0);
  EXPECT_NEAR(step5, step0, 0.25 * step0);
}

TEST(SpecProbe, DoublyShuffledDraftFallsToAboutOne) {
  Probe p;
  const TensorMeta& fc_meta = *find(p.draft, "draft.fc.weight");
  // Resident after the legacy finalize: shuffle(shuffle(w)); read through the runner's layout
  // (one unshuffle), the probe sees shuffle(w).
  Bytes resident = p.draft_fc();
  apply_layout(Layout::kShuffle, fc_meta, resident);
  apply_layout(Layout::kShuffle, fc_meta, resident);
  undo_layout(Layout::kShuffle, fc_meta, resident);
  const double corrupted = p.run(5, resident);
  std::printf("accept length with the double-shuffled draft: %.2f\n", corrupted);
  EXPECT_LT(corrupted, 1.2);
}

TEST(SpecProbe, RefusesMismatchedSizes) {
  Probe p;
  Bytes fc = p.draft_fc();
  fc.pop_back();
  EXPECT_THROW(p.run(0, fc), comm::EnforceError);
}

}  // namespace
}  // namespace weightcast::sync
