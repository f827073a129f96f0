#include "sync/trainer/megatron.h"

#include <algorithm>
#include <cstring>

#include "comm/enum_names.h"
#include "comm/errors.h"

namespace weightcast::sync::trainer {

namespace {

std::int64_t rows_of(const TensorMeta& meta) {
  return meta.shape.empty() ? 1 : meta.shape[0];
}

// Bytes of one row (everything after dim 0).
std::size_t row_bytes(const TensorMeta& meta) {
  const auto rows = rows_of(meta);
  return rows == 0 ? 0 : meta.byte_count() / static_cast<std::size_t>(rows);
}

}  // namespace

std::string_view to_string(TpSplit split) {
  static constexpr auto kNames =
      comm::enum_names<TpSplit>("tensor-parallel split", {{TpSplit::kReplicated, "replicated"},
                                                          {TpSplit::kDim0, "dim0"},
                                                          {TpSplit::kDim1, "dim1"},
                                                          {TpSplit::kFusedDim0, "fused-dim0"}});
  return kNames.name_or(split, "?");
}

std::vector<std::int64_t> MegatronParam::shape() const {
  std::vector<std::int64_t> out = parts.front().shape;
  if (!out.empty()) {
    out[0] = 0;
    for (const auto& part : parts) out[0] += rows_of(part);
  }
  return out;
}

std::size_t MegatronParam::byte_count() const {
  std::size_t total = 0;
  for (const auto& part : parts) total += part.byte_count();
  return total;
}

StageLayers stage_layers(const ModelSpec& spec, int stage, int stages) {
  if (stages < 1 || stage < 0 || stage >= stages) {
    throw comm::ConfigError("pipeline stage " + std::to_string(stage) + " of " +
                            std::to_string(stages) + " does not exist");
  }
  if (spec.num_layers < stages) {
    throw comm::ConfigError("pipeline parallel size " + std::to_string(stages) +
                            " exceeds the model's " + std::to_string(spec.num_layers) +
                            " layers: every stage needs at least one");
  }
  return {stage * spec.num_layers / stages, (stage + 1) * spec.num_layers / stages};
}

void check_tp_divisible(const std::vector<MegatronParam>& params, int tp) {
  WC_ENFORCE_GE(tp, 1);
  for (const auto& param : params) {
    for (const auto& part : param.parts) {
      std::size_t dim = 0;
      if (param.split == TpSplit::kReplicated) continue;
      if (param.split == TpSplit::kDim1) {
        if (part.shape.size() != 2) {
          throw comm::ConfigError("tensor '" + part.name + "': row-parallel split needs 2 dims");
        }
        dim = 1;
      }
      const std::int64_t extent = part.shape.empty() ? 1 : part.shape[dim];
      if (extent % tp != 0) {
        throw comm::ConfigError("tensor '" + part.name + "' dim " + std::to_string(dim) + " (" +
                                std::to_string(extent) + ") is not divisible by tp " +
                                std::to_string(tp));
      }
    }
  }
}

std::size_t shard_bytes(const MegatronParam& param, int tp) {
  const std::size_t full = param.byte_count();
  return param.split == TpSplit::kReplicated ? full : full / static_cast<std::size_t>(tp);
}

void append_shard(const MegatronParam& param, int tp, int tp_rank, const HfBytes& hf,
                  std::vector<std::byte>& out) {
  WC_ENFORCE(tp_rank >= 0 && tp_rank < tp, "tp_rank ", tp_rank, " of ", tp);
  const auto add = [&out](std::span<const std::byte> piece) {
    out.insert(out.end(), piece.begin(), piece.end());
  };
  for (const auto& part : param.parts) {
    std::span<const std::byte> full = hf(part);
    WC_ENFORCE_EQ(full.size(), part.byte_count(), "bytes of ", part.name);
    const auto t = static_cast<std::size_t>(tp);
    const auto r = static_cast<std::size_t>(tp_rank);
    switch (param.split) {
      case TpSplit::kReplicated:
        add(full);
        break;
      case TpSplit::kDim0:
      case TpSplit::kFusedDim0:
        add(full.subspan(r * (full.size() / t), full.size() / t));
        break;
      case TpSplit::kDim1: {
        const auto rows = static_cast<std::size_t>(part.shape[0]);
        const std::size_t row = rows == 0 ? 0 : full.size() / rows;
        for (std::size_t i = 0; i < rows; ++i) add(full.subspan(i * row + r * (row / t), row / t));
        break;
      }
    }
  }
}

void write_hf(const MegatronParam& param, std::span<const std::span<const std::byte>> shards,
              std::span<const std::span<std::byte>> out) {
  WC_ENFORCE(!shards.empty(), "no shards for ", param.name);
  WC_ENFORCE_EQ(out.size(), param.parts.size(), "HF tensors of ", param.name);
  const std::size_t t = shards.size();
  const std::size_t expected = shard_bytes(param, static_cast<int>(t));
  const std::size_t used = param.split == TpSplit::kReplicated ? 1 : t;
  for (std::size_t r = 0; r < used; ++r) {
    WC_ENFORCE_EQ(shards[r].size(), expected, "shard ", r, " of ", param.name);
  }
  std::size_t part_offset = 0;  // within each shard: where the current part's slice starts
  for (std::size_t p = 0; p < param.parts.size(); ++p) {
    const TensorMeta& part = param.parts[p];
    const std::size_t full = part.byte_count();
    WC_ENFORCE_EQ(out[p].size(), full, "bytes of ", part.name);
    std::byte* dst = out[p].data();
    switch (param.split) {
      case TpSplit::kReplicated:
        if (full > 0) std::memcpy(dst, shards[0].data() + part_offset, full);
        part_offset += full;
        break;
      case TpSplit::kDim0:
      case TpSplit::kFusedDim0:
        for (std::size_t r = 0; r < t; ++r) {
          if (full > 0) std::memcpy(dst + r * (full / t), shards[r].data() + part_offset, full / t);
        }
        part_offset += full / t;
        break;
      case TpSplit::kDim1: {
        const auto rows = static_cast<std::size_t>(part.shape[0]);
        const std::size_t row = row_bytes(part);
        const std::size_t piece = row / t;
        for (std::size_t r = 0; r < t; ++r) {
          for (std::size_t i = 0; i < rows; ++i) {
            std::memcpy(dst + i * row + r * piece, shards[r].data() + part_offset + i * piece,
                        piece);
          }
        }
        part_offset += full / t;
        break;
      }
    }
  }
}

std::vector<HostTensor> allocate_hf(std::span<const MegatronParam> params) {
  std::vector<HostTensor> out;
  for (const auto& param : params) {
    for (const auto& part : param.parts) {
      out.push_back({part, std::vector<std::byte>(part.byte_count())});
    }
  }
  return out;
}

std::vector<std::span<std::byte>> bytes_of(std::vector<HostTensor>& tensors) {
  std::vector<std::span<std::byte>> out;
  out.reserve(tensors.size());
  for (auto& t : tensors) out.emplace_back(t.bytes);
  return out;
}

std::vector<HostTensor> to_hf(const MegatronParam& param,
                              std::span<const std::span<const std::byte>> shards) {
  std::vector<HostTensor> out = allocate_hf({&param, 1});
  write_hf(param, shards, bytes_of(out));
  return out;
}

std::size_t contributed_bytes(const MegatronParam& param, int tp, int tp_rank, int ep_rank) {
  const int owner = std::max(param.ep_rank, 0);  // dense params come from EP rank 0
  if (ep_rank != owner) return 0;
  if (param.split == TpSplit::kReplicated) return tp_rank == 0 ? param.byte_count() : 0;
  return shard_bytes(param, tp);
}

std::vector<std::byte> rank_shards(const std::vector<MegatronParam>& params, int tp, int tp_rank,
                                   std::uint64_t seed, std::uint64_t step, int ep_rank) {
  std::vector<std::byte> out;
  std::vector<std::byte> full;
  const HfBytes generate = [&](const TensorMeta& meta) -> std::span<const std::byte> {
    full.resize(meta.byte_count());
    fill_tensor(meta, seed, step, full);
    return full;
  };
  // Sized once: grown by appends, a model-sized buffer is copied and faulted in again at every
  // doubling.
  std::size_t total = 0;
  for (const auto& param : params) total += contributed_bytes(param, tp, tp_rank, ep_rank);
  out.reserve(total);
  for (const auto& param : params) {
    if (contributed_bytes(param, tp, tp_rank, ep_rank) == 0) continue;
    append_shard(param, tp, tp_rank, generate, out);
  }
  return out;
}

void assemble_hf_into(std::span<const MegatronParam> params,
                      std::span<const std::span<const std::byte>> blocks, int tp,
                      std::span<const std::span<std::byte>> out, std::span<Digest> digests) {
  WC_ENFORCE_GE(tp, 1);
  WC_ENFORCE(digests.empty() || digests.size() == out.size(), "digests (", digests.size(), ") for ",
             out.size(), " HF tensors");
  WC_ENFORCE(!blocks.empty() && blocks.size() % static_cast<std::size_t>(tp) == 0, "blocks (",
             blocks.size(), ") must be a multiple of tp ", tp);
  const auto t = static_cast<std::size_t>(tp);
  std::vector<std::size_t> offset(blocks.size(), 0);
  std::vector<std::span<const std::byte>> shards(t);
  std::size_t next = 0;  // the first HF tensor of the current param in `out`
  for (const auto& param : params) {
    const std::size_t bytes = shard_bytes(param, tp);
    const std::size_t ranks = param.split == TpSplit::kReplicated ? 1 : t;
    const std::size_t base = static_cast<std::size_t>(std::max(param.ep_rank, 0)) * t;
    WC_ENFORCE_LT(base, blocks.size(), "no blocks from the EP rank of ", param.name);
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::size_t b = base + r;
      WC_ENFORCE_LE(offset[b] + bytes, blocks[b].size(), "block ", b, " too short at ", param.name);
      shards[r] = blocks[b].subspan(offset[b], bytes);
      offset[b] += bytes;
    }
    WC_ENFORCE_LE(next + param.parts.size(), out.size(), "HF tensors for ", param.name);
    write_hf(param, std::span(shards).first(t), out.subspan(next, param.parts.size()));
    if (!digests.empty()) {
      for (std::size_t j = next; j < next + param.parts.size(); ++j) {
        digests[j] = tensor_digest(out[j]);
      }
    }
    next += param.parts.size();
  }
  WC_ENFORCE_EQ(next, out.size(), "HF tensors left unwritten");
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    WC_ENFORCE_EQ(offset[b], blocks[b].size(), "block ", b, " too long");
  }
}

std::vector<HostTensor> assemble_hf(const std::vector<MegatronParam>& params,
                                    std::span<const std::span<const std::byte>> blocks, int tp) {
  std::vector<HostTensor> out = allocate_hf(params);
  assemble_hf_into(params, blocks, tp, bytes_of(out));
  return out;
}

}  // namespace weightcast::sync::trainer
