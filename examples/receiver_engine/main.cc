// receiver_engine: a minimal C++ engine rank built on weightcast's Receiver, against the installed
// package (find_package(weightcast), target weightcast::weightcast).
//
// Usage: weightcast-receiver-engine [--help] [--rank N] [--ranks N]
// It creates one Receiver with a single target runner whose `load` counts the tensors it is
// handed, and prints the committed weight version:
//   receiver_engine: rank 0 of 1, weight version default, runners 1
// An engine forwards its control plane's calls (join, begin, receive, commit, abort) to the
// Receiver as docs/library.md describes; this example stops after construction.
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sync/engine/commit/receiver.h"

namespace engine = weightcast::sync::engine;

namespace {

void usage() {
  std::printf(
      "usage: weightcast-receiver-engine [--help] [--rank N] [--ranks N]\n"
      "  A minimal engine rank on weightcast::Receiver: creates the receiver with one target\n"
      "  runner and prints its weight version.\n");
}

}  // namespace

int main(int argc, char** argv) {
  engine::ReceiverOptions opts;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    }
    if ((arg == "--rank" || arg == "--ranks") && i + 1 < argc) {
      int value = std::atoi(argv[++i]);
      (arg == "--rank" ? opts.place.engine_rank : opts.place.rank_count) = value;
      continue;
    }
    usage();
    return 2;
  }

  std::size_t loaded = 0;
  engine::ReceiverRunner target;
  target.id = weightcast::sync::Runner::kTarget;
  target.load = [&loaded](std::span<const engine::TensorView> views) { loaded += views.size(); };
  std::vector<engine::ReceiverRunner> runners;
  runners.push_back(std::move(target));

  const engine::ReceiverPlace place = opts.place;
  engine::Receiver receiver(std::move(opts), std::move(runners));
  std::printf("receiver_engine: rank %d of %d, weight version %s, runners %zu\n", place.engine_rank,
              place.rank_count, receiver.weight_version().c_str(), receiver.runners().size());
  return 0;
}
