#include "sync/model/expert_placement.h"

#include <algorithm>
#include <cstddef>

#include "comm/errors.h"

namespace weightcast::sync {

namespace {

// A non-negative decimal index without sign or leading zero, at most 9 digits (fits an int).
std::optional<int> parse_index(std::string_view segment) {
  if (segment.empty() || segment.size() > 9) return std::nullopt;
  if (segment.size() > 1 && segment.front() == '0') return std::nullopt;
  int value = 0;
  for (const char c : segment) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

struct Segment {
  std::size_t begin = 0;
  std::string_view text;
};

std::vector<Segment> segments(std::string_view name) {
  std::vector<Segment> out;
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    out.push_back({start, name.substr(start, dot - start)});
    start = dot + 1;
  }
  return out;
}

// The index of the expert-number segment, or nullopt.
std::optional<std::size_t> expert_segment(const std::vector<Segment>& segs) {
  // The number must be followed by the tensor's own name: i + 2 < size.
  for (std::size_t i = 0; i + 2 < segs.size(); ++i) {
    if (segs[i].text == "experts" && parse_index(segs[i + 1].text)) return i + 1;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ExpertRef> parse_expert(std::string_view hf_name) {
  const std::vector<Segment> segs = segments(hf_name);
  const auto at = expert_segment(segs);
  if (!at) return std::nullopt;
  ExpertRef ref;
  ref.expert = *parse_index(segs[*at].text);
  for (std::size_t i = 0; i + 1 < *at; ++i) {
    if (segs[i].text != "layers") continue;
    if (const auto layer = parse_index(segs[i + 1].text)) {
      ref.layer = *layer;
      break;
    }
  }
  return ref;
}

std::string with_expert_index(std::string_view hf_name, int expert) {
  if (expert < 0) {
    throw comm::ConfigError("expert index " + std::to_string(expert) + " is negative");
  }
  const std::vector<Segment> segs = segments(hf_name);
  const auto at = expert_segment(segs);
  if (!at) {
    throw comm::ConfigError("'" + std::string(hf_name) + "' is not a routed expert's tensor");
  }
  const Segment& seg = segs[*at];
  std::string out(hf_name.substr(0, seg.begin));
  out += std::to_string(expert);
  out += hf_name.substr(seg.begin + seg.text.size());
  return out;
}

PlacementStrategy parse_placement_strategy(std::string_view text) {
  if (text == "linear") return PlacementStrategy::kLinear;
  if (text == "round_robin") return PlacementStrategy::kRoundRobin;
  throw comm::ConfigError("expert placement '" + std::string(text) +
                          "' is not one of linear, round_robin");
}

std::string_view to_string(PlacementStrategy strategy) {
  return strategy == PlacementStrategy::kLinear ? "linear" : "round_robin";
}

int ep_rank_of_tp_rank(int tp_rank, int tp_size, int ep_size) {
  if (ep_size < 1 || tp_size < 1 || tp_size % ep_size != 0) {
    throw comm::ConfigError("ep_size " + std::to_string(ep_size) + " must divide tp_size " +
                            std::to_string(tp_size));
  }
  if (tp_rank < 0 || tp_rank >= tp_size) {
    throw comm::ConfigError("tp_rank " + std::to_string(tp_rank) + " is outside [0, " +
                            std::to_string(tp_size) + ")");
  }
  return tp_rank / (tp_size / ep_size);
}

ExpertPlacement::ExpertPlacement(int num_experts, int ep_size, int ep_rank,
                                 PlacementStrategy strategy)
    : num_experts_(num_experts), ep_size_(ep_size), ep_rank_(ep_rank), strategy_(strategy) {
  if (num_experts < 1) {
    throw comm::ConfigError("an expert placement needs at least one expert, got " +
                            std::to_string(num_experts));
  }
  if (ep_size < 1 || ep_size > num_experts) {
    throw comm::ConfigError("ep_size " + std::to_string(ep_size) + " must be in [1, " +
                            std::to_string(num_experts) + "] (the number of experts)");
  }
  if (ep_rank < 0 || ep_rank >= ep_size) {
    throw comm::ConfigError("ep_rank " + std::to_string(ep_rank) + " is outside [0, " +
                            std::to_string(ep_size) + ")");
  }
}

int ExpertPlacement::num_local_experts(int rank) const {
  if (rank < 0 || rank >= ep_size_) return 0;
  const int base = num_experts_ / ep_size_;
  const int remainder = num_experts_ % ep_size_;
  return base + (rank < remainder ? 1 : 0);  // both strategies: the first `remainder` get one more
}

std::vector<int> ExpertPlacement::local_experts() const {
  std::vector<int> out;
  const int n = num_local();
  out.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out.push_back(global_index(i));
  return out;
}

std::optional<int> ExpertPlacement::local_index(int expert) const {
  if (expert < 0 || expert >= num_experts_ || owner(expert) != ep_rank_) return std::nullopt;
  if (strategy_ == PlacementStrategy::kRoundRobin) return expert / ep_size_;
  const int base = num_experts_ / ep_size_;
  const int remainder = num_experts_ % ep_size_;
  return expert - (ep_rank_ * base + std::min(ep_rank_, remainder));
}

int ExpertPlacement::global_index(int local) const {
  if (local < 0 || local >= num_local()) {
    throw comm::ConfigError("local expert " + std::to_string(local) + " is outside [0, " +
                            std::to_string(num_local()) + ") on EP rank " +
                            std::to_string(ep_rank_));
  }
  if (strategy_ == PlacementStrategy::kRoundRobin) return ep_rank_ + local * ep_size_;
  const int base = num_experts_ / ep_size_;
  const int remainder = num_experts_ % ep_size_;
  return ep_rank_ * base + std::min(ep_rank_, remainder) + local;
}

int ExpertPlacement::owner(int expert) const {
  if (expert < 0 || expert >= num_experts_) {
    throw comm::ConfigError("expert " + std::to_string(expert) + " is outside [0, " +
                            std::to_string(num_experts_) + ")");
  }
  if (strategy_ == PlacementStrategy::kRoundRobin) return expert % ep_size_;
  const int base = num_experts_ / ep_size_;
  const int remainder = num_experts_ % ep_size_;
  // The first `remainder` ranks hold base + 1 experts each.
  const int big = remainder * (base + 1);
  if (expert < big) return expert / (base + 1);
  return remainder + (expert - big) / base;
}

bool ExpertPlacement::accepts(std::string_view hf_name) const {
  const auto ref = parse_expert(hf_name);
  if (!ref) return true;
  return holds(ref->expert);
}

std::string ExpertPlacement::describe() const {
  std::string out = "experts ";
  const std::vector<int> mine = local_experts();
  if (strategy_ == PlacementStrategy::kLinear) {
    out += "[" + std::to_string(mine.front()) + ", " + std::to_string(mine.back() + 1) + ")";
  } else {
    out += "{";
    for (std::size_t i = 0; i < mine.size() && i < 4; ++i) {
      out += (i ? ", " : "") + std::to_string(mine[i]);
    }
    if (mine.size() > 4) out += ", ...";
    out += "}";
  }
  out += " of " + std::to_string(num_experts_) + " (ep " + std::to_string(ep_size_) + ", rank " +
         std::to_string(ep_rank_) + ", " + std::string(to_string(strategy_)) + ")";
  return out;
}

}  // namespace weightcast::sync
