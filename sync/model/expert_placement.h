// Expert placement: which routed experts an engine rank with expert parallelism holds, decided
// the way the engines decide it, and a name predicate that keeps a rank's own experts.
//
// Engines receive full per-expert HF tensors (model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj
// .weight, in Qwen3-MoE's and DeepSeek-V2/V3's naming alike; Mixtral's block_sparse_moe.experts.{e}
// .w{1,2,3} too) and a rank with expert parallelism drops the experts it does not hold. Placement:
//  - kLinear (SGLang, and vLLM's default "linear"): contiguous blocks. With E experts over n EP
//    ranks, rank p holds [p*b + min(p, r), ...) of b + (p < r) experts, b = E / n, r = E % n.
//    When n divides E (SGLang requires it) that is [p*E/n, (p+1)*E/n), the same block Megatron's
//    EP rank p holds (docs/trainer.md, "Mixtures of experts").
//  - kRoundRobin (vLLM's "round_robin"): rank p holds experts p, p + n, p + 2n, ...
// An engine's EP rank from its TP rank (SGLang: ep_size divides tp_size; each EP rank spans
// tp_size / ep_size TP ranks): ep_rank_of_tp_rank(). Redundant experts (EPLB) and shared experts
// fused in as expert E are not modelled: a rank holds each logical expert once or not at all.
//
// Use on an engine rank (with its runner's NameFilter):
//   const ExpertPlacement mine(spec.num_experts, ep_size, ep_rank_of_tp_rank(rank, ranks,
//   ep_size)); if (filter.accepts(name) && mine.accepts(name)) load(name, bytes);
// Lifetime/threading: immutable values and pure functions; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::sync {

// The place of a routed expert's tensor in an HF name: "model.layers.3.mlp.experts.17.up_proj
// .weight" -> {layer 3, expert 17}. The expert index follows a dot-separated "experts" segment
// and is followed by at least one more segment; the layer (-1 when the name has none) follows a
// "layers" segment. Shared experts ("mlp.shared_experts.gate_proj", "mlp.shared_expert.up_proj"),
// the router ("mlp.gate.weight") and experts stacked into one tensor ("mlp.experts.gate_up_proj")
// are not routed experts' tensors: nullopt. Indices with a sign, a leading zero or more than 9
// digits are not indices either.
struct ExpertRef {
  int layer = -1;
  int expert = 0;

  bool operator==(const ExpertRef&) const = default;
};
std::optional<ExpertRef> parse_expert(std::string_view hf_name);

// The same name with the expert index replaced ("...experts.3.down_proj" with 11 ->
// "...experts.11.down_proj"): local <-> global renaming. Throws comm::ConfigError for a name
// parse_expert() refuses or a negative index.
std::string with_expert_index(std::string_view hf_name, int expert);

enum class PlacementStrategy { kLinear, kRoundRobin };

// "linear" / "round_robin" (vLLM's spelling); throws comm::ConfigError naming the choices.
PlacementStrategy parse_placement_strategy(std::string_view text);
std::string_view to_string(PlacementStrategy strategy);

// An engine's EP rank from its TP rank, as SGLang computes it: tp_rank / (tp_size / ep_size).
// Throws comm::ConfigError unless 1 <= ep_size, ep_size divides tp_size and 0 <= tp_rank < tp_size.
int ep_rank_of_tp_rank(int tp_rank, int tp_size, int ep_size);

class ExpertPlacement {
 public:
  // Throws comm::ConfigError unless num_experts >= 1, 1 <= ep_size <= num_experts and
  // 0 <= ep_rank < ep_size. (A dense model has no placement: check spec.is_moe() first.)
  ExpertPlacement(int num_experts, int ep_size, int ep_rank,
                  PlacementStrategy strategy = PlacementStrategy::kLinear);

  int num_experts() const { return num_experts_; }
  int ep_size() const { return ep_size_; }
  int ep_rank() const { return ep_rank_; }
  PlacementStrategy strategy() const { return strategy_; }

  // How many experts this rank holds, and which, in local order (local index i -> result[i]).
  int num_local() const { return num_local_experts(ep_rank_); }
  std::vector<int> local_experts() const;
  // Global expert `expert` held here: its local index; otherwise (or out of [0, E)) nullopt.
  std::optional<int> local_index(int expert) const;
  bool holds(int expert) const { return local_index(expert).has_value(); }
  // Local index -> global expert. Throws comm::ConfigError outside [0, num_local()).
  int global_index(int local) const;
  // The EP rank that holds global expert `expert` (the same for every rank's placement).
  // Throws comm::ConfigError outside [0, num_experts()).
  int owner(int expert) const;
  // The number of experts EP rank `rank` holds under this placement's E, n and strategy.
  int num_local_experts(int rank) const;

  // NameFilter-compatible: every tensor that is not a routed expert's (dense, router, shared
  // expert, norms), and a routed expert's tensor only when this rank holds that expert. An expert
  // index outside [0, E) is held by no rank: false.
  bool accepts(std::string_view hf_name) const;

  // "experts [4, 8) of 8 (ep 2, rank 1, linear)"; round robin lists the first few.
  std::string describe() const;

 private:
  int num_experts_;
  int ep_size_;
  int ep_rank_;
  PlacementStrategy strategy_;
};

}  // namespace weightcast::sync
