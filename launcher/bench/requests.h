// weightcast-bench requests: what the control plane costs per tensor. A bucket request of
// --tensors expert-named tensors (with digests, as weightcast-train sends them) is built
// (to_json_string) and parsed as the engine parses it (parse_update_weights_from_distributed:
// strict JSON, duplicate keys refused, every field checked), beside two peers measured in the
// same run on the same body: nlohmann's own DOM parse, and its SAX lexer with a handler that
// keeps nothing (the floor of any parser built on it). A mixture of experts sends thousands of
// tensors per update, so these microseconds add up (docs/performance.md, "Per-tensor costs").
#pragma once

namespace weightcast::launcher {

struct RequestsBenchOptions {
  int tensors = 512;
  int iters = 300;
};

int run_requests_bench(const RequestsBenchOptions& options);

}  // namespace weightcast::launcher
