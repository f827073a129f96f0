#include "sync/engine/control/group_table.h"

#include <algorithm>

namespace weightcast::sync::engine {

std::shared_ptr<Group> GroupTable::find(const std::string& name) const {
  auto it = groups_.find(name);
  return it == groups_.end() ? nullptr : it->second;
}

bool GroupTable::any_busy() const {
  return std::any_of(groups_.begin(), groups_.end(),
                     [](const auto& entry) { return entry.second->busy(); });
}

std::uint64_t GroupTable::bytes_received() const {
  std::uint64_t bytes = bytes_retired_;
  for (const auto& [name, group] : groups_) bytes += group->bytes_received();
  return bytes;
}

std::shared_ptr<Group> GroupTable::begin_join(const std::string& name) {
  joining_.insert(name);
  return remove(name);
}

void GroupTable::end_join(const std::string& name, std::shared_ptr<Group> group) {
  joining_.erase(name);
  if (group) groups_[name] = std::move(group);
}

std::shared_ptr<Group> GroupTable::remove(const std::string& name) {
  elsewhere_.erase(name);
  auto it = groups_.find(name);
  if (it == groups_.end()) return nullptr;
  std::shared_ptr<Group> group = std::move(it->second);
  groups_.erase(it);
  bytes_retired_ += group->bytes_received();
  return group;
}

GroupTable::Groups GroupTable::take_all() {
  Groups out;
  out.swap(groups_);
  for (const auto& [name, group] : out) bytes_retired_ += group->bytes_received();
  return out;
}

std::uint64_t GroupTable::sequence(const std::string& name, std::uint64_t session_id,
                                   std::optional<std::uint64_t> given) {
  auto& [arrival_session, next] = arrivals_[name];
  if (arrival_session != session_id) {
    arrival_session = session_id;
    next = 0;
  }
  return given.value_or(next);
}

void GroupTable::queued(const std::string& name, std::uint64_t sequence) {
  std::uint64_t& next = arrivals_[name].second;
  next = std::max(next, sequence + 1);
}

}  // namespace weightcast::sync::engine
