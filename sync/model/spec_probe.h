// Speculative-decoding probe: measures how many tokens per verification round a draft model
// gets accepted by its target, the figure that collapses to 1.00 when a draft's weights are read
// through the wrong layout (the double-shuffle bug in docs/architecture.md).
//
// The decoder is deliberately small but real: a token's hidden state is its embedding row; the
// target's next token is argmax over lm_head · h; the EAGLE-style draft maps h through its own
// fc ([h, 2h], applied to [h; h]) before the same lm_head. Greedy speculative decoding: the
// draft proposes k tokens, the target checks them in order, the matching prefix plus the
// target's own next token are emitted; accept length = accepted + 1 per round (1.00 = the draft
// never helps, k + 1 = always right). docs/performance.md describes the method.
// Inputs are LOGICAL tensors (layouts already undone). Pure function; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "sync/protocol/dtype.h"

namespace weightcast::sync {

struct SpecProbeInput {
  DType dtype = DType::kBFloat16;  // float32, float16, bfloat16 or float64
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::span<const std::byte> embed;     // [vocab, hidden]
  std::span<const std::byte> lm_head;   // [vocab, hidden] (the embedding when tied)
  std::span<const std::byte> draft_fc;  // [hidden, 2 * hidden]
};

struct SpecProbeOptions {
  int draft_tokens = 4;  // k
  int prompts = 64;      // fixed synthetic start tokens
  int rounds = 8;        // verification rounds per prompt
  // Only the first vocab_limit tokens are candidates (prompts and argmax), so the probe costs
  // O(vocab_limit * hidden) per token whatever the real vocabulary: a few ms on the demo model,
  // about a second on a 1024-wide one.
  std::int64_t vocab_limit = 2048;
};

struct SpecProbeResult {
  double accept_length = 0;  // mean of (accepted + 1) over all rounds
  std::int64_t rounds = 0;
  std::int64_t accepted = 0;
};

// Throws EnforceError when a span's size does not match the shapes or the dtype is not a
// supported float type.
SpecProbeResult run_spec_probe(const SpecProbeInput& in, const SpecProbeOptions& opts = {});

}  // namespace weightcast::sync
