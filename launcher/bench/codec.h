// weightcast-bench codec: the delta codecs (sync/model/delta.h) on the buckets of realistic drift
// (sync/model/drift.h), as the source and an engine run them: per codec and step, the payload's
// size against the bucket's, encode and decode speed (bucket bytes per second, one core), and
// #wrong, the buckets whose decode differs from what was encoded (a non-zero total fails the
// run). This is how the default codec was chosen (docs/performance.md, "Delta updates").
#pragma once

#include <cstdint>

#include "launcher/bench/table.h"

namespace weightcast::launcher {

struct CodecBenchOptions {
  std::uint64_t model_bytes = 512u << 20;
  std::uint64_t bucket_bytes = 128u << 20;
  int steps = 3;
  double lr = 0;  // 0: the realistic rate
  BenchOutput output;
};

int run_codec_bench(const CodecBenchOptions& options);

}  // namespace weightcast::launcher
