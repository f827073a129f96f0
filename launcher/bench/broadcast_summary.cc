// The broadcast table's closing notes (launcher/bench/broadcast_summary.h).
#include "launcher/bench/broadcast_summary.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>

#include "launcher/cli_util.h"

namespace weightcast::launcher {
namespace {

using BandwidthBySize = std::map<std::string, std::map<std::uint64_t, double>>;

// The chain's worst ratio against each peer over sizes in [lo, hi), and the geometric mean of
// its ratios over those sizes.
void note_ratios(BenchTable& table, const BandwidthBySize& bw, std::uint64_t lo, std::uint64_t hi,
                 const std::string& label) {
  const auto& chain = bw.at("gloo-chain");
  for (const auto& [name, rows] : bw) {
    if (name == "gloo-chain") continue;
    double worst = 0, log_sum = 0;
    std::uint64_t worst_at = 0;
    int n = 0;
    for (const auto& [bytes, gbps] : chain) {
      const auto peer = rows.find(bytes);
      if (bytes < lo || bytes >= hi || peer == rows.end() || peer->second <= 0) continue;
      const double ratio = gbps / peer->second;
      if (n == 0 || ratio < worst) worst = ratio, worst_at = bytes;
      log_sum += std::log(ratio);
      ++n;
    }
    if (n == 0) continue;
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "%s: gloo-chain / %s worst %.2fx (at %s), geomean %.2fx over %d sizes",
                  label.c_str(), name.c_str(), worst, format_bytes(worst_at).c_str(),
                  std::exp(log_sum / n), n);
    table.note(buf);
  }
}

// nccl-tests' closing line (average bus bandwidth per backend, #wrong), then our chain's ratio
// against each peer at the largest size and below 16 MiB, all measured in this run.
}  // namespace

void summarize_broadcast(BenchTable& table, const std::vector<std::string>& backends,
                         std::uint64_t wrong) {
  BandwidthBySize bw;
  for (const auto& row : table.rows()) {
    bw[std::get<std::string>(row[1])][std::get<std::uint64_t>(row[0])] = std::get<double>(row[3]);
  }
  std::string avg = "Avg bus bandwidth:";
  for (const auto& name : backends) {
    double sum = 0;
    for (const auto& [bytes, gbps] : bw[name]) sum += gbps;
    char buf[128];
    std::snprintf(buf, sizeof(buf), " %s %.3f GB/s;", name.c_str(),
                  bw[name].empty() ? 0.0 : sum / static_cast<double>(bw[name].size()));
    avg += buf;
  }
  table.note(avg + " #wrong total: " + std::to_string(wrong));
  if (!bw.count("gloo-chain") || bw["gloo-chain"].empty()) return;
  const auto largest = bw["gloo-chain"].rbegin();
  for (const auto& [name, rows] : bw) {
    if (name == "gloo-chain" || !rows.count(largest->first)) continue;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "ratio at %s: gloo-chain / %s = %.2fx",
                  format_bytes(largest->first).c_str(), name.c_str(),
                  largest->second / rows.at(largest->first));
    table.note(buf);
  }
  // The small-buffer target (below 16 MiB), and from 4 MiB up, where the chain should match the
  // shared-memory MPI_Bcast on one host.
  note_ratios(table, bw, 0, 16u << 20, "below 16 MiB");
  note_ratios(table, bw, 4u << 20, UINT64_MAX, "from 4 MiB");
}

}  // namespace weightcast::launcher
