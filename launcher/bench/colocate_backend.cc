#include "launcher/bench/colocate_backend.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "comm/colocate/handle_exchange.h"
#include "comm/colocate/segment.h"
#include "comm/colocate/segment_server.h"
#include "comm/errors.h"
#include "sync/model/checksum.h"

namespace weightcast::launcher {
namespace {

constexpr const char* kToken = "weightcast-bench";

// The segment's first page holds the root's progress word: (broadcast number << 40) | bytes
// written so far; the bytes follow it.
constexpr std::size_t kHeader = 4096;
constexpr std::size_t kChunk = std::size_t{1} << 20;
constexpr std::size_t kSequentialMax = std::size_t{4} << 20;
constexpr std::size_t kCopyChunk = std::size_t{256} << 10;  // as MappedSegment::copy_through

struct Colocated {
  std::optional<comm::colocate::SharedSegment> segment;  // the root's
  std::optional<comm::colocate::MappedSegment> mapped;   // every other rank's
  std::uint64_t broadcasts = 0;
};

std::uint64_t progress_word(std::uint64_t broadcast, std::size_t written) {
  return (broadcast << 40) | written;
}

}  // namespace

std::optional<ColocatedBackendOptions> colocated_backend_options(std::string_view name) {
  if (name == "colocate") return ColocatedBackendOptions{};
  if (name == "colocate-hash") return ColocatedBackendOptions{.hash = true};
  if (name == "colocate-arena") return ColocatedBackendOptions{.in_place = true};
  if (name == "colocate-arena-hash") return ColocatedBackendOptions{.hash = true, .in_place = true};
  if (name == "colocate-arena-map-hash") {
    return ColocatedBackendOptions{.hash = true, .in_place = true, .from_mapping = true};
  }
  return std::nullopt;
}

ColocatedBroadcast colocated_broadcast(int rank, int size, std::size_t max_bytes,
                                       comm::Millis timeout, ColocatedBackendOptions options) {
  auto state = std::make_shared<Colocated>();
  char name[108] = {};
  std::unique_ptr<comm::colocate::SegmentServer> server;
  if (rank == 0) {
    state->segment.emplace(max_bytes + kHeader, "weightcast-bench");
    server = std::make_unique<comm::colocate::SegmentServer>();
    std::snprintf(name, sizeof(name), "%s", server->name().c_str());
  }
  MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    server->serve(kToken, state->segment->reader_fd(), max_bytes + kHeader, size - 1,
                  comm::deadline_after(timeout));
  } else {
    const auto handle = comm::colocate::fetch_handle(name, kToken, timeout);
    state->mapped.emplace(handle.fd, handle.size);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ColocatedBroadcast out;
  if (options.in_place && rank == 0) out.root_buffer = state->segment->bytes().data() + kHeader;
  out.run = [state, rank, max_bytes, options](void* p, std::size_t n, int root) {
    const bool in_place = options.in_place;
    if (root != 0 || n > max_bytes) {
      throw comm::ConfigError("colocate: the root must be rank 0 and a broadcast at most " +
                              std::to_string(max_bytes) + " bytes");
    }
    // Pipelined: the root publishes its progress after every chunk it writes; the others copy
    // each chunk out as soon as it is there (yielding while they wait: the cores are shared).
    const std::uint64_t id = ++state->broadcasts;
    auto* bytes = static_cast<std::byte*>(p);
    sync::Hasher hasher;
    const auto visit = [&](std::span<const std::byte> chunk) {
      if (options.hash) hasher.update(chunk);
    };
    // A reader's copy of [offset, +into.size()) of the segment.
    const auto read = [&](std::size_t offset, std::span<std::byte> into) {
      if (!options.from_mapping) {
        state->mapped->copy_through(offset, into, visit);
        return;
      }
      const std::byte* from = state->mapped->bytes().data() + offset;
      for (std::size_t done = 0; done < into.size(); done += kCopyChunk) {
        const std::size_t len = std::min(kCopyChunk, into.size() - done);
        std::memcpy(into.data() + done, from + done, len);
        visit(into.subspan(done, len));
      }
    };
    if (n <= kSequentialMax) {
      // Small: one write, a barrier, one read each (spinning on progress costs more here).
      if (rank == 0 && !in_place) std::memcpy(state->segment->bytes().data() + kHeader, bytes, n);
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank != 0) {
        read(kHeader, {bytes, n});
      }
    } else if (rank == 0) {
      std::byte* base = state->segment->bytes().data();
      auto* progress = reinterpret_cast<std::uint64_t*>(base);
      if (in_place) {  // the bytes are there already: all of them at once
        WC_ENFORCE(p == base + kHeader, "colocate-arena: the root broadcasts its root_buffer");
        __atomic_store_n(progress, progress_word(id, n), __ATOMIC_RELEASE);
      } else {
        for (std::size_t at = 0; at < n; at += kChunk) {
          const std::size_t len = std::min(kChunk, n - at);
          std::memcpy(base + kHeader + at, bytes + at, len);
          __atomic_store_n(progress, progress_word(id, at + len), __ATOMIC_RELEASE);
        }
      }
    } else {
      const auto* progress = reinterpret_cast<const std::uint64_t*>(state->mapped->bytes().data());
      for (std::size_t at = 0; at < n; at += kChunk) {
        const std::size_t len = std::min(kChunk, n - at);
        while (__atomic_load_n(progress, __ATOMIC_ACQUIRE) < progress_word(id, at + len)) {
          sched_yield();
        }
        read(kHeader + at, {bytes + at, len});
      }
    }
    if (options.hash && rank != 0) {
      volatile std::uint64_t low = hasher.digest().low;  // computed, not elided
      (void)low;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  };
  return out;
}

}  // namespace weightcast::launcher
