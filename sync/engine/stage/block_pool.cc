#include "sync/engine/stage/block_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "comm/huge_pages.h"

namespace weightcast::sync::engine {

namespace {

constexpr std::size_t kPage = 4096;
// A free piece at least this much larger than a request is split; smaller slack stays attached
// (a bucket a little smaller than its block, the usual last bucket).
constexpr std::size_t kSplitBytes = std::size_t{1} << 20;

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

// An anonymous mapping, unmapped when the last block or free piece of it goes.
struct Arena {
  std::byte* base = nullptr;
  std::size_t size = 0;

  // `huge`: advise transparent huge pages. Only for arenas pre-faulted at start-up: faulting
  // huge pages on demand may compact memory synchronously, which measured slower on the
  // receive path than small pages.
  Arena(std::size_t bytes, bool huge) : size(bytes) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Advice only: where huge pages are off, the arena is backed by small pages.
    if (huge && size >= comm::kHugePageBytes) madvise(p, size, MADV_HUGEPAGE);
    base = static_cast<std::byte*>(p);
  }
  ~Arena() { munmap(base, size); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
};

struct Piece {
  std::shared_ptr<Arena> arena;
  std::byte* data = nullptr;
  std::size_t capacity = 0;
};

}  // namespace

struct BlockPool::State {
  std::mutex mu;
  // By address, so that a piece given back merges with its free neighbours of the same arena:
  // blocks come back in another order and other sizes than they were taken in (a multi-rank
  // engine's other ranks give theirs back at once, rank 0's go with the weights they hold), and
  // without merging the pool would fragment into pieces too small for the next bucket.
  std::map<std::byte*, Piece> free;
  BlockPoolStats stats;

  void give_back(Piece piece) {
    std::lock_guard lock(mu);
    stats.free_bytes += piece.capacity;
    auto it = free.emplace(piece.data, std::move(piece)).first;
    const auto adjacent = [](const Piece& a, const Piece& b) {
      return a.arena == b.arena && a.data + a.capacity == b.data;
    };
    if (auto next = std::next(it); next != free.end() && adjacent(it->second, next->second)) {
      it->second.capacity += next->second.capacity;
      free.erase(next);
    }
    if (it != free.begin()) {
      if (auto prev = std::prev(it); adjacent(prev->second, it->second)) {
        prev->second.capacity += it->second.capacity;
        free.erase(it);
      }
    }
  }

  // Takes the best-fitting free piece for `need` bytes, splitting off a large remainder.
  bool take(std::size_t need, Piece& out) {
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it) {
      const std::size_t cap = it->second.capacity;
      if (cap >= need && (best == free.end() || cap < best->second.capacity)) best = it;
    }
    if (best == free.end()) return false;
    out = std::move(best->second);
    free.erase(best);
    stats.free_bytes -= out.capacity;
    stats.reuses += 1;
    if (out.capacity - need >= kSplitBytes) {
      Piece rest{out.arena, out.data + need, out.capacity - need};
      out.capacity = need;
      stats.free_bytes += rest.capacity;
      free.emplace(rest.data, std::move(rest));
    }
    return true;
  }

  // Moves the arenas that are wholly free and smaller than `need` into `dropped`: the bucket
  // sizes grew past them. Arenas still partly in use keep their free pieces.
  void drop_free_arenas_below(std::size_t need, std::vector<Piece>& dropped) {
    for (auto it = free.begin(); it != free.end();) {
      const Piece& p = it->second;
      if (p.data == p.arena->base && p.capacity == p.arena->size && p.capacity < need) {
        stats.free_bytes -= p.capacity;
        stats.allocated_bytes -= p.capacity;
        dropped.push_back(std::move(it->second));
        it = free.erase(it);
      } else {
        ++it;
      }
    }
  }
};

BlockPool::BlockPool() : state_(std::make_shared<State>()) {}
BlockPool::~BlockPool() = default;

std::shared_ptr<const Block> BlockPool::acquire(std::size_t bytes) {
  const std::size_t need = round_up(bytes == 0 ? 1 : bytes, kPage);
  Piece piece;
  std::vector<Piece> dropped;  // unmapped after the lock
  {
    std::lock_guard lock(state_->mu);
    auto& s = *state_;
    if (!s.take(need, piece)) {
      s.drop_free_arenas_below(need, dropped);
      s.stats.allocations += 1;
      s.stats.allocated_bytes += need;
    }
  }
  if (!piece.arena) piece = Piece{std::make_shared<Arena>(need, false), nullptr, need};
  if (piece.data == nullptr) piece.data = piece.arena->base;
  std::weak_ptr<State> weak = state_;
  auto* block = new Block(piece.data, piece.capacity);
  return std::shared_ptr<const Block>(block, [weak, piece](const Block* b) mutable {
    if (auto state = weak.lock()) state->give_back(std::move(piece));
    delete b;
  });
}

void BlockPool::reserve(std::size_t bytes) {
  if (bytes == 0) return;
  const std::size_t size = round_up(bytes, kPage);
  auto arena = std::make_shared<Arena>(size, true);
  // Touch every page now, at start-up, rather than on the first update's receive path.
  // Populating the page tables is not enough on a virtual machine whose host maps a guest page
  // only when it is first written: every page is written too (docs/performance.md, "First
  // update").
#ifdef MADV_POPULATE_WRITE
  madvise(arena->base, size, MADV_POPULATE_WRITE);
#endif
  std::memset(arena->base, 0, size);
  std::byte* base = arena->base;
  {
    std::lock_guard lock(state_->mu);
    state_->stats.allocations += 1;
    state_->stats.allocated_bytes += size;
  }
  state_->give_back(Piece{std::move(arena), base, size});
}

BlockPoolStats BlockPool::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

SharedBytes SharedBytes::adopt(std::vector<std::byte> bytes) {
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  return SharedBytes(owner, std::span<std::byte>(owner->data(), owner->size()));
}

SharedBytes SharedBytes::copy_of(std::span<const std::byte> bytes) {
  // Default-initialized: the copy below writes every byte.
  std::shared_ptr<std::byte[]> owner(new std::byte[bytes.size() == 0 ? 1 : bytes.size()]);
  std::copy(bytes.begin(), bytes.end(), owner.get());
  return SharedBytes(owner, std::span<std::byte>(owner.get(), bytes.size()));
}

}  // namespace weightcast::sync::engine
