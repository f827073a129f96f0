#include "sync/engine/receive/segment_copy.h"

#include <unistd.h>

#include <utility>

#include "comm/colocate/handle_exchange.h"
#include "comm/colocate/segment.h"
#include "comm/errors.h"
#include "sync/engine/commit/receiver_loader.h"

namespace weightcast::sync::engine {
namespace {

comm::colocate::MappedSegment map_segment(const UpdateWeightsFromTensorRequest& request,
                                          const std::string& token, comm::Millis timeout) {
  comm::colocate::ReceivedHandle handle;
  try {
    handle = comm::colocate::fetch_handle(request.segment.socket, token, timeout);
  } catch (const comm::TimeoutError& e) {
    throw ReceiverError(504, std::string("segment: ") + e.what());
  } catch (const comm::Error& e) {
    throw ReceiverError(400, std::string("segment: ") + e.what());
  }
  if (handle.size != request.segment.size) {
    ::close(handle.fd);
    throw ReceiverError(400, "segment.size: the request says " +
                                 std::to_string(request.segment.size) +
                                 " bytes, the trainer's handle " + std::to_string(handle.size));
  }
  try {
    return comm::colocate::MappedSegment(handle.fd, handle.size);  // takes the descriptor
  } catch (const comm::Error& e) {
    throw ReceiverError(400, std::string("segment: ") + e.what());
  }
}

}  // namespace

std::vector<SegmentTensor> copy_segment(const UpdateWeightsFromTensorRequest& request,
                                        const std::string& token, BlockPool& pool,
                                        comm::Millis timeout) {
  std::vector<Digest> expected;
  try {
    for (const auto& d : request.digests) expected.push_back(parse_digest(d, "digests"));
  } catch (const comm::BadRequestError& e) {
    throw ReceiverError(400, e.what());
  }
  const comm::colocate::MappedSegment segment = map_segment(request, token, timeout);
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
    segment.copy_through(request.offsets[i], into,
                         [&](std::span<const std::byte> chunk) { hasher.update(chunk); });
    const Digest digest = hasher.digest();
    if (digest != expected[i]) {
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

}  // namespace weightcast::sync::engine
