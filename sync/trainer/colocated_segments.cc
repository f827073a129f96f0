#include "sync/trainer/colocated_segments.h"

#include <algorithm>
#include <utility>

#include "comm/enum_names.h"
#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync::trainer {
namespace {

constexpr std::size_t kSegmentGranule = std::size_t{1} << 20;
constexpr auto kMemories = comm::enum_names<ColocateMemory>(
    "colocate memory", {{ColocateMemory::kHost, "host"}, {ColocateMemory::kCuda, "cuda"}});

}  // namespace

std::string_view to_string(ColocateMemory memory) {
  return kMemories.name(memory);
}

ColocateMemory parse_colocate_memory(std::string_view text) {
  return parse_name<comm::ConfigError>(kMemories, text);
}

void ColocatedSegments::reserve(std::size_t bytes) {
  const auto fits = [bytes](const auto& slot) { return slot && slot->size() >= bytes; };
  if (fits(host_[0]) && fits(host_[1]) &&
      (memory_ == ColocateMemory::kHost || (fits(device_slots_[0]) && fits(device_slots_[1])))) {
    return;
  }
  const std::size_t size = std::max<std::size_t>(
      kSegmentGranule, (bytes + kSegmentGranule - 1) / kSegmentGranule * kSegmentGranule);
  for (int i = 0; i < 2; ++i) {
    host_[i].reset();  // the old ones first: both at once could double the memory held
    device_slots_[i].reset();
  }
  for (int i = 0; i < 2; ++i) {
    host_[i].emplace(size, "weightcast-bucket");
    if (memory_ == ColocateMemory::kCuda) {
      device_slots_[i] = std::make_unique<comm::colocate::CudaIpcSegment>(size, device_);
    }
  }
}

comm::colocate::SharedSegment& ColocatedSegments::host(std::uint64_t k) {
  WC_ENFORCE(host_[k % 2].has_value(), "bucket ", k, ": no host segment reserved");
  return *host_[k % 2];
}

comm::colocate::CudaIpcSegment& ColocatedSegments::device(std::uint64_t k) {
  WC_ENFORCE(device_slots_[k % 2] != nullptr, "bucket ", k, ": no device segment reserved");
  return *device_slots_[k % 2];
}

void ColocatedSegments::retire_device() {
  for (auto& slot : device_slots_) {
    if (slot) retired_.push_back(std::move(slot));
  }
  while (retired_.size() > kMaxRetired) retired_.pop_front();
}

}  // namespace weightcast::sync::trainer
