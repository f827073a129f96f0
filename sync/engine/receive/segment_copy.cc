#include "sync/engine/receive/segment_copy.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "comm/colocate/handle_exchange.h"
#include "comm/colocate/segment.h"
#include "comm/errors.h"
#include "sync/engine/commit/receiver_loader.h"

namespace weightcast::sync::engine {
namespace {

// A connected socket to the abstract name `name`, closed on destruction.
class AbstractSocket {
 public:
  explicit AbstractSocket(const std::string& name) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0)
      throw ReceiverError(500, "segment.socket: socket(): " + std::string(strerror(errno)));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (name.size() + 1 > sizeof(addr.sun_path)) {
      throw ReceiverError(400, "segment.socket: name too long");
    }
    std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      const int err = errno;
      ::close(fd_);
      throw ReceiverError(400, "segment.socket: no trainer serves '" + name + "' on this host (" +
                                   std::string(strerror(err)) + ")");
    }
  }
  ~AbstractSocket() { ::close(fd_); }
  AbstractSocket(const AbstractSocket&) = delete;
  AbstractSocket& operator=(const AbstractSocket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

comm::colocate::MappedSegment map_segment(const UpdateWeightsFromTensorRequest& request,
                                          const std::string& token, comm::Millis timeout) {
  AbstractSocket socket(request.segment.socket);
  comm::colocate::ReceivedHandle handle;
  try {
    handle = comm::colocate::receive_handle(socket.fd(), token, timeout);
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
