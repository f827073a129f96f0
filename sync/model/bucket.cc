#include "sync/model/bucket.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {
namespace {

constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();

void check_alignment(std::size_t alignment) {
  WC_ENFORCE(alignment > 0 && (alignment & (alignment - 1)) == 0,
             "bucket alignment must be a power of two, got ", alignment);
}

// Where a tensor of `bytes` bytes starts after a bucket that currently ends at `end`.
std::size_t place(std::size_t end, std::size_t bytes, std::size_t alignment,
                  const TensorMeta& meta) {
  if (bytes == 0) return end;
  const std::size_t mask = alignment - 1;
  if (end > kSizeMax - mask) {
    throw comm::BadRequestError("bucket offset of tensor " + sync::quoted(meta.name) +
                                " overflows");
  }
  const std::size_t offset = (end + mask) & ~mask;
  if (bytes > kSizeMax - offset) {
    throw comm::BadRequestError("bucket size overflows at tensor " + sync::quoted(meta.name));
  }
  return offset;
}

void append(BucketPlan& plan, TensorMeta meta, std::size_t offset, std::size_t bytes) {
  plan.total_bytes = offset + bytes;
  plan.entries.push_back(BucketEntry{std::move(meta), offset, bytes});
}

// Where the tensors [first, end) of `metas` end when placed from `end` on.
std::size_t span_end(const std::vector<TensorMeta>& metas, std::size_t first, std::size_t last,
                     std::size_t end, std::size_t alignment) {
  for (std::size_t i = first; i < last; ++i) {
    const std::size_t bytes = metas[i].byte_count();
    end = place(end, bytes, alignment, metas[i]) + bytes;
  }
  return end;
}

}  // namespace

std::vector<BucketPlan> plan_buckets(const std::vector<TensorMeta>& metas,
                                     std::size_t max_bucket_bytes, std::size_t alignment,
                                     std::span<const AtomicGroup> groups) {
  WC_ENFORCE_GT(max_bucket_bytes, 0u, "max_bucket_bytes");
  check_alignment(alignment);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    WC_ENFORCE(groups[g].first < groups[g].end && groups[g].end <= metas.size(), "atomic group ",
               groups[g].name, " outside the tensor list");
    WC_ENFORCE(g == 0 || groups[g - 1].end <= groups[g].first, "atomic groups out of order at ",
               groups[g].name);
  }
  std::vector<BucketPlan> plans;
  std::size_t next_group = 0;
  std::size_t group_end = 0;  // tensors before this index belong to an already placed group
  for (std::size_t i = 0; i < metas.size(); ++i) {
    const TensorMeta& meta = metas[i];
    const std::size_t bytes = meta.byte_count();
    bool forced = i < group_end;  // inside a group its first member placed: no split
    if (next_group < groups.size() && groups[next_group].first == i) {
      const AtomicGroup& group = groups[next_group++];
      group_end = group.end;
      const std::size_t alone = span_end(metas, group.first, group.end, 0, alignment);
      if (alone > max_bucket_bytes) {
        throw comm::ConfigError(
            "atomic group " + sync::quoted(group.name) + " (" +
            std::to_string(group.end - group.first) + " tensors, " + std::to_string(alone) +
            " bytes) does not fit in a bucket of " + std::to_string(max_bucket_bytes) +
            " bytes; an engine loads these tensors together, so raise the bucket size");
      }
      // The whole group joins the current bucket if it fits there, else opens the next one.
      const bool fits = plans.empty() || plans.back().total_bytes == 0 ||
                        span_end(metas, group.first, group.end, plans.back().total_bytes,
                                 alignment) <= max_bucket_bytes;
      if (fits && !plans.empty()) {
        forced = true;
      } else {
        BucketPlan next;
        next.sequence = plans.size();
        append(next, meta, 0, bytes);
        plans.push_back(std::move(next));
        continue;
      }
    }
    std::size_t offset = 0;
    if (!plans.empty()) {
      BucketPlan& current = plans.back();
      offset = place(current.total_bytes, bytes, alignment, meta);
      // An empty bucket (only zero-byte tensors so far) takes any tensor: no collective is
      // spent on zero bytes.
      const bool fits =
          forced || bytes == 0 || current.total_bytes == 0 || offset + bytes <= max_bucket_bytes;
      if (fits) {
        append(current, meta, offset, bytes);
        continue;
      }
      offset = 0;
    }
    BucketPlan next;
    next.sequence = plans.size();
    append(next, meta, offset, bytes);
    plans.push_back(std::move(next));
  }
  return plans;
}

BucketPlan make_bucket(std::uint64_t sequence, std::vector<TensorMeta> metas,
                       std::size_t alignment) {
  check_alignment(alignment);
  BucketPlan plan;
  plan.sequence = sequence;
  plan.entries.reserve(metas.size());
  for (TensorMeta& meta : metas) {
    const std::size_t bytes = meta.byte_count();
    const std::size_t offset = place(plan.total_bytes, bytes, alignment, meta);
    append(plan, std::move(meta), offset, bytes);
  }
  return plan;
}

std::size_t max_total_bytes(const std::vector<BucketPlan>& plans) {
  std::size_t out = 0;
  for (const auto& p : plans) out = std::max(out, p.total_bytes);
  return out;
}

void pack(const BucketPlan& plan, const TensorSource& source, std::span<std::byte> out) {
  pack_with(
      plan,
      [&source](const BucketEntry& e, std::span<std::byte> to) {
        const std::span<const std::byte> src = source(e);
        WC_ENFORCE_EQ(src.size(), e.bytes, "source bytes of tensor ", e.meta.name);
        if (e.bytes > 0) std::memcpy(to.data(), src.data(), e.bytes);
      },
      out);
}

void pack_with(const BucketPlan& plan, const TensorWriter& write, std::span<std::byte> out) {
  WC_ENFORCE_EQ(out.size(), plan.total_bytes, "pack buffer size, bucket ", plan.sequence);
  std::size_t end = 0;  // bytes written so far; the gap up to each offset is padding
  for (const BucketEntry& e : plan.entries) {
    WC_ENFORCE_LE(end, e.offset, "bucket entries out of order at ", e.meta.name);
    WC_ENFORCE_LE(e.offset, plan.total_bytes, "entry offset past the bucket: ", e.meta.name);
    WC_ENFORCE_LE(e.bytes, plan.total_bytes - e.offset, "entry past the bucket: ", e.meta.name);
    if (e.offset > end) std::memset(out.data() + end, 0, e.offset - end);
    write(e, out.subspan(e.offset, e.bytes));
    end = e.offset + e.bytes;
  }
  if (out.size() > end) std::memset(out.data() + end, 0, out.size() - end);
}

std::vector<TensorBytes> unpack(std::span<const std::byte> buffer, const BucketPlan& plan) {
  WC_ENFORCE_EQ(buffer.size(), plan.total_bytes, "unpack buffer size, bucket ", plan.sequence);
  std::vector<TensorBytes> out;
  out.reserve(plan.entries.size());
  for (const BucketEntry& e : plan.entries) {
    WC_ENFORCE_LE(e.offset, buffer.size(), "entry offset past the bucket: ", e.meta.name);
    WC_ENFORCE_LE(e.bytes, buffer.size() - e.offset, "entry past the bucket: ", e.meta.name);
    out.push_back(TensorBytes{&e, buffer.subspan(e.offset, e.bytes)});
  }
  return out;
}

}  // namespace weightcast::sync
