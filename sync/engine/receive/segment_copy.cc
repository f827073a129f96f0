#include "sync/engine/receive/segment_copy.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "comm/colocate/cuda_ipc.h"
#include "comm/errors.h"
#include "sync/engine/commit/receiver_loader.h"

namespace weightcast::sync::engine {
namespace {

std::shared_ptr<const comm::colocate::MappedSegment> map_segment(
    const UpdateWeightsFromTensorRequest& request, const std::string& token,
    comm::colocate::SegmentMappings& mappings, comm::Millis timeout) {
  try {
    return mappings.map(request.segment.socket, token, request.segment.size, timeout);
  } catch (const comm::TimeoutError& e) {
    throw ReceiverError(504, std::string("segment: ") + e.what());
  } catch (const comm::Error& e) {
    throw ReceiverError(400, std::string("segment: ") + e.what());
  }
}

// Copies each manifest tensor through `source` into one pool block, hashing each chunk while it
// is in cache; checks the digests when the request carries them.
template <typename Source>
std::vector<SegmentTensor> copy_bucket(const UpdateWeightsFromTensorRequest& request,
                                       const std::vector<Digest>& expected, BlockPool& pool,
                                       const Source& source) {
  std::size_t total = 0;
  for (const auto& t : request.tensors) total += t.byte_count();
  auto block = pool.acquire(total);
  std::vector<SegmentTensor> out;
  out.reserve(request.tensors.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < request.tensors.size(); ++i) {
    const std::size_t bytes = request.tensors[i].byte_count();
    const std::span<std::byte> into(block->data() + at, bytes);
    Hasher hasher;
    source(request.offsets[i], into,
           [&](std::span<const std::byte> chunk) { hasher.update(chunk); });
    const Digest digest = hasher.digest();
    if (!expected.empty() && digest != expected[i]) {
      throw ReceiverError(400, "digests[" + std::to_string(i) + "]: '" + request.tensors[i].name +
                                   "' holds " + to_string(digest) +
                                   " in the segment, the "
                                   "trainer sent " +
                                   to_string(expected[i]));
    }
    out.push_back({SharedBytes(block, into), digest});
    at += bytes;
  }
  return out;
}

// A device segment: opened from its CUDA IPC handle on `device` (-1: the calling thread's current
// one, which is left as it was), each tensor copied to staging in pieces, each piece hashed while
// in cache, closed before returning. CUDA's refusals (no device here, a forged handle) and a size
// past the exported allocation are 400s.
std::vector<SegmentTensor> copy_cuda_segment(const UpdateWeightsFromTensorRequest& request,
                                             const std::vector<Digest>& expected, BlockPool& pool,
                                             int device) {
  constexpr std::size_t kPiece = 1 << 20;  // one synchronous device-to-host copy, then hashed
  try {
    const comm::colocate::CudaIpcMapping mapping(
        comm::colocate::CudaIpcHandle::from_hex(request.segment.cuda_ipc, "segment.cuda_ipc"),
        request.segment.size, device);
    return copy_bucket(request, expected, pool,
                       [&](std::uint64_t offset, std::span<std::byte> into, const auto& visit) {
                         for (std::size_t done = 0; done < into.size(); done += kPiece) {
                           const std::size_t n = std::min(kPiece, into.size() - done);
                           mapping.copy_to_host(into.data() + done, offset + done, n);
                           visit(std::span<const std::byte>(into.data() + done, n));
                         }
                       });
  } catch (const comm::ConfigError& e) {
    throw ReceiverError(400, std::string("segment.cuda_ipc: ") + e.what());
  } catch (const comm::BadRequestError& e) {
    throw ReceiverError(400, e.what());
  }
}

}  // namespace

std::vector<SegmentTensor> copy_segment(const UpdateWeightsFromTensorRequest& request,
                                        const std::string& token, BlockPool& pool,
                                        comm::colocate::SegmentMappings& mappings,
                                        comm::Millis timeout, int cuda_device) {
  std::vector<Digest> expected;
  try {
    for (const auto& d : request.digests) expected.push_back(parse_digest(d, "digests"));
  } catch (const comm::BadRequestError& e) {
    throw ReceiverError(400, e.what());
  }
  WC_ENFORCE_EQ(expected.size(), request.tensors.size(), "segment digests");
  if (!request.segment.cuda_ipc.empty()) {
    return copy_cuda_segment(request, expected, pool, cuda_device);
  }
  const auto segment = map_segment(request, token, mappings, timeout);
  struct Done {  // done() once the copy is over, however it ends
    comm::colocate::SegmentMappings& mappings;
    const comm::colocate::MappedSegment& segment;
    ~Done() { mappings.done(segment); }
  } done{mappings, *segment};
  return copy_bucket(request, expected, pool,
                     [&](std::uint64_t offset, std::span<std::byte> into, const auto& visit) {
                       segment->copy_through(offset, into, visit);
                     });
}

std::vector<SegmentTensor> copy_local(const UpdateWeightsFromTensorRequest& request,
                                      std::span<const std::byte> bytes, BlockPool& pool) {
  WC_ENFORCE_EQ(static_cast<std::uint64_t>(bytes.size()), request.segment.size, "local bucket");
  constexpr std::size_t kChunk = 256 * 1024;
  return copy_bucket(request, {}, pool,
                     [&](std::uint64_t offset, std::span<std::byte> into, const auto& visit) {
                       for (std::size_t done = 0; done < into.size(); done += kChunk) {
                         const std::size_t n = std::min(kChunk, into.size() - done);
                         std::memcpy(into.data() + done, bytes.data() + offset + done, n);
                         visit(std::span<const std::byte>(into.data() + done, n));
                       }
                     });
}

}  // namespace weightcast::sync::engine
