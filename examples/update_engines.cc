// Calling DistributedUpdater from your own trainer: no launcher, no MPI, one process.
//
//   build/launcher/engine/weightcast-engine --port 0 --draft --target-layout shuffle &
//   build/examples/weightcast-example-update http://127.0.0.1:PORT [more engine URLs]
//
// Expected output (timings vary):
//   selector target
//   update 1: version 1 selector target tensors 21 bytes 3410432 buckets 4 seconds 0.026 GB/s 0.132
//   update 2: version 2 selector target tensors 21 bytes 3410432 buckets 4 seconds 0.017 GB/s 0.196
#include <cstdio>
#include <string>
#include <vector>

#include "sync/model/model.h"
#include "sync/trainer/updater.h"

int main(int argc, char** argv) {
  namespace ws = weightcast::sync;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ENGINE_URL [ENGINE_URL...]\n", argv[0]);
    return 2;
  }
  ws::trainer::UpdaterOptions options;
  // What the decision function needs: speculative decoding on, no trained MTP layers, raw
  // conversion. It picks "target", so the engines' frozen draft is never touched.
  options.selector_config = {"EAGLE", 0, "raw"};
  options.buckets.bucket_bytes = 1 << 20;
  ws::trainer::DistributedUpdater updater(std::vector<std::string>(argv + 1, argv + argc), options);
  std::printf("selector %s\n", std::string(ws::to_string(updater.selector())).c_str());

  const ws::ModelSpec spec = ws::model_preset("tiny");  // the engines' --model
  for (std::uint64_t step = 1; step <= 2; ++step) {
    // Your trainer's weights, already named as the engine expects (HF names).
    std::vector<ws::trainer::HostTensor> weights;
    for (const auto& meta : ws::target_tensors(spec)) {
      auto& t = weights.emplace_back(ws::trainer::HostTensor{meta, {}});
      t.bytes.resize(meta.byte_count());
      ws::fill_tensor(meta, /*seed=*/0, step, t.bytes);
    }
    const ws::trainer::UpdateReport report = updater.update(ws::trainer::views(weights));
    std::printf("update %llu: %s\n", static_cast<unsigned long long>(step),
                ws::trainer::summary(report).c_str());
    std::fflush(stdout);
    if (!report.ok) return 1;
  }
  return 0;
}
