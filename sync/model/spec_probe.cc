#include "sync/model/spec_probe.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

// Decodes `count` elements of `dtype` into floats.
std::vector<float> to_floats(std::span<const std::byte> bytes, DType dtype, std::size_t count) {
  std::vector<float> out(count);
  const std::byte* p = bytes.data();
  for (std::size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
      case DType::kFloat64: {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
        break;
      }
      case DType::kBFloat16: {
        std::uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
        break;
      }
      case DType::kFloat16: {
        std::uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = half_to_float(b);
        break;
      }
      default:
        WC_ENFORCE(false, "spec probe needs a float dtype, got ", to_string(dtype));
    }
  }
  return out;
}

class Decoder {
 public:
  Decoder(const SpecProbeInput& in, std::int64_t vocab_limit)
      : v_(static_cast<std::size_t>(std::min(in.vocab_size, vocab_limit))),
        h_(static_cast<std::size_t>(in.hidden_size)) {
    const std::size_t es = element_size(in.dtype);
    const auto full = static_cast<std::size_t>(in.vocab_size);
    WC_ENFORCE_EQ(in.embed.size(), full * h_ * es, "embed bytes");
    WC_ENFORCE_EQ(in.lm_head.size(), full * h_ * es, "lm_head bytes");
    WC_ENFORCE_EQ(in.draft_fc.size(), 2 * h_ * h_ * es, "draft fc bytes");
    embed_ = to_floats(in.embed, in.dtype, v_ * h_);
    lm_head_ = to_floats(in.lm_head, in.dtype, v_ * h_);
    fc_ = to_floats(in.draft_fc, in.dtype, 2 * h_ * h_);
    target_next_.assign(v_, -1);
    draft_next_.assign(v_, -1);
  }

  std::int64_t target(std::int64_t tok) {
    auto& slot = target_next_[static_cast<std::size_t>(tok)];
    if (slot < 0) slot = argmax(&embed_[static_cast<std::size_t>(tok) * h_]);
    return slot;
  }

  std::int64_t draft(std::int64_t tok) {
    auto& slot = draft_next_[static_cast<std::size_t>(tok)];
    if (slot < 0) {
      const float* e = &embed_[static_cast<std::size_t>(tok) * h_];
      std::vector<float> hidden(h_, 0.0f);
      for (std::size_t r = 0; r < h_; ++r) {
        const float* row = &fc_[r * 2 * h_];
        float acc = 0;
        for (std::size_t c = 0; c < h_; ++c) acc += row[c] * e[c] + row[h_ + c] * e[c];
        hidden[r] = acc;
      }
      slot = argmax(hidden.data());
    }
    return slot;
  }

  std::size_t vocab() const { return v_; }

 private:
  std::int64_t argmax(const float* hidden) const {
    std::int64_t best = 0;
    float best_logit = -std::numeric_limits<float>::infinity();
    for (std::size_t t = 0; t < v_; ++t) {
      const float* row = &lm_head_[t * h_];
      float logit = 0;
      for (std::size_t c = 0; c < h_; ++c) logit += row[c] * hidden[c];
      if (logit > best_logit) {  // NaN never wins, so garbage weights still give a token
        best_logit = logit;
        best = static_cast<std::int64_t>(t);
      }
    }
    return best;
  }

  std::size_t v_, h_;
  std::vector<float> embed_, lm_head_, fc_;
  std::vector<std::int64_t> target_next_, draft_next_;
};

}  // namespace

SpecProbeResult run_spec_probe(const SpecProbeInput& in, const SpecProbeOptions& opts) {
  WC_ENFORCE_GT(in.vocab_size, 0, "vocab_size");
  WC_ENFORCE_GT(in.hidden_size, 0, "hidden_size");
  WC_ENFORCE_GT(opts.draft_tokens, 0, "draft_tokens");
  WC_ENFORCE_GT(opts.prompts, 0, "prompts");
  WC_ENFORCE_GT(opts.rounds, 0, "rounds");
  WC_ENFORCE_GT(opts.vocab_limit, 0, "vocab_limit");
  Decoder dec(in, opts.vocab_limit);
  SpecProbeResult res;
  for (int p = 0; p < opts.prompts; ++p) {
    // Fixed synthetic prompts: start tokens spread over the vocabulary.
    std::int64_t cur = static_cast<std::int64_t>(
        (static_cast<std::uint64_t>(p) * 0x9E3779B97F4A7C15ull >> 17) % dec.vocab());
    for (int r = 0; r < opts.rounds; ++r) {
      std::int64_t ctx = cur;
      int accepted = 0;
      for (int i = 0; i < opts.draft_tokens; ++i) {
        const std::int64_t proposal = dec.draft(ctx);
        if (proposal != dec.target(ctx)) break;
        ++accepted;
        ctx = proposal;
      }
      cur = dec.target(ctx);  // the bonus token the target emits after the accepted prefix
      res.accepted += accepted;
      res.rounds += 1;
    }
  }
  res.accept_length =
      static_cast<double>(res.accepted + res.rounds) / static_cast<double>(res.rounds);
  return res;
}

}  // namespace weightcast::sync
