#include "launcher/bench/codec.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "comm/deadline.h"
#include "launcher/cli_util.h"
#include "sync/model/bucket.h"
#include "sync/model/delta.h"
#include "sync/model/drift.h"
#include "sync/model/model.h"

namespace weightcast::launcher {

namespace {

using comm::seconds_since;

// The model's buckets as the source packs them, from per-tensor bytes.
std::vector<std::vector<std::byte>> pack_all(const std::vector<sync::BucketPlan>& plans,
                                             const std::vector<sync::TensorMeta>& metas,
                                             const std::vector<std::vector<std::byte>>& bytes) {
  std::vector<std::vector<std::byte>> out;
  for (const auto& plan : plans) {
    std::vector<std::byte> bucket(plan.total_bytes);
    sync::pack(
        plan,
        [&](const sync::BucketEntry& e) -> std::span<const std::byte> {
          for (std::size_t i = 0; i < metas.size(); ++i) {
            if (metas[i].name == e.meta.name) return bytes[i];
          }
          return {};
        },
        bucket);
    out.push_back(std::move(bucket));
  }
  return out;
}

// The model's tensors at step 0, then drifted one step at a time.
struct DriftingModel {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<sync::Drift> drifts;

  DriftingModel(const std::vector<sync::TensorMeta>& metas, double lr) : bytes(metas.size()) {
    for (std::size_t i = 0; i < metas.size(); ++i) {
      bytes[i].resize(metas[i].byte_count());
      sync::fill_tensor(metas[i], 1, 0, bytes[i]);
      drifts.emplace_back(metas[i].dtype, bytes[i], 1, lr);
    }
  }
  // Moves to `step`; returns the percentage of elements that changed.
  double advance(int step) {
    std::size_t changed = 0;
    std::size_t elements = 0;
    for (std::size_t i = 0; i < drifts.size(); ++i) {
      changed += drifts[i].step(static_cast<std::uint64_t>(step), bytes[i]);
      elements += drifts[i].elements();
    }
    return 100.0 * static_cast<double>(changed) / static_cast<double>(elements);
  }
};

// One codec over every bucket: bytes in and on the wire, seconds each way, buckets wrong.
struct CodecResult {
  double enc_s = 0;
  double dec_s = 0;
  std::uint64_t total = 0;
  std::uint64_t wire = 0;
  std::uint64_t wrong = 0;
};

CodecResult measure_codec(sync::DeltaCodec codec, const std::vector<std::vector<std::byte>>& base,
                          const std::vector<std::vector<std::byte>>& next,
                          std::vector<std::byte>& payload) {
  sync::DeltaEncoder encoder(codec);
  sync::DeltaDecoder decoder(codec);
  CodecResult r;
  for (std::size_t b = 0; b < next.size(); ++b) {
    auto t = std::chrono::steady_clock::now();
    const bool ok = encoder.encode(next[b], base[b], next[b].size() + 1024, payload);
    r.enc_s += seconds_since(t);
    r.total += next[b].size();
    r.wire += payload.size();
    std::vector<std::byte> out = base[b];
    t = std::chrono::steady_clock::now();
    decoder.decode(payload, out);
    r.dec_s += seconds_since(t);
    r.wrong += !ok || out != next[b];
  }
  return r;
}

BenchTable codec_table() {
  return BenchTable("codec", {{"step", 5, 0},
                              {"codec", 9, 0},
                              {"changed%", 9, 2},
                              {"bucket", 12, 0},
                              {"payload", 12, 0},
                              {"ratio", 8, 1},
                              {"enc_GB/s", 9, 2},
                              {"dec_GB/s", 9, 2}});
}

}  // namespace

int run_codec_bench(const CodecBenchOptions& o) {
  const auto metas = sync::hf_tensors(sync::model_spec_for_bytes(o.model_bytes));
  const auto plans = sync::plan_buckets(metas, o.bucket_bytes);
  const double lr = o.lr > 0 ? o.lr : sync::kRealisticLr;
  DriftingModel model(metas, lr);
  BenchTable table = codec_table();
  char head[200];
  std::snprintf(head, sizeof(head),
                "weightcast-bench codec: model %s, %zu buckets of at most %s, drift lr %.2g, one "
                "core each way",
                format_bytes(sync::total_bytes(metas)).c_str(), plans.size(),
                format_bytes(o.bucket_bytes).c_str(), lr);
  table.begin(head);
  auto base = pack_all(plans, metas, model.bytes);
  std::vector<std::byte> payload;
  for (int step = 1; step <= o.steps; ++step) {
    const double pct = model.advance(step);
    const auto next = pack_all(plans, metas, model.bytes);
    for (sync::DeltaCodec codec : sync::kAllDeltaCodecs) {
      const CodecResult r = measure_codec(codec, base, next, payload);
      table.add({std::uint64_t(step), std::string(sync::to_string(codec)), pct, r.total, r.wire,
                 static_cast<double>(r.total) / static_cast<double>(r.wire),
                 static_cast<double>(r.total) / r.enc_s / 1e9,
                 static_cast<double>(r.total) / r.dec_s / 1e9},
                r.wrong);
    }
    base = next;
  }
  table.write(o.output);
  return table.wrong() ? 1 : 0;
}

}  // namespace weightcast::launcher
