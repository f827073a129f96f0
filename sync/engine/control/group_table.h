// GroupTable: the engine's joined weight-update groups by name, the names being joined, and the
// arrival order of bucket requests that carry no sequence (SGLang and Miles send none).
//
// A name being joined is reserved (a second init of it is refused) until the join ends; a group
// is only replaced while idle. Removing a group retires the bytes it received into the total, so
// /metrics never goes back.
// Lifetime: owned by the Receiver. Threading: not thread-safe; the Receiver calls it under its
// lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "sync/engine/receive/receive_pipeline.h"

namespace weightcast::sync::engine {

class GroupTable {
 public:
  using Groups = std::map<std::string, std::shared_ptr<Group>>;

  // The group of that name, or null.
  std::shared_ptr<Group> find(const std::string& name) const;
  const Groups& all() const { return groups_; }
  std::size_t size() const { return groups_.size(); }
  bool any_busy() const;
  // Bytes received by every group, present and removed.
  std::uint64_t bytes_received() const;

  bool joining(const std::string& name) const { return joining_.count(name) != 0; }
  // Reserves `name` for a join; the group it replaces (null when none) leaves the table.
  std::shared_ptr<Group> begin_join(const std::string& name);
  // Ends the join of `name`: `group` (null when the join failed) takes the name.
  void end_join(const std::string& name, std::shared_ptr<Group> group);
  // The group of that name leaves the table (null when none); so does its elsewhere mark.
  std::shared_ptr<Group> remove(const std::string& name);
  // Shard-aware broadcast (docs/sharding.md): a group of this engine that none of this
  // receiver's ranks joined. Its buckets are answered without receiving; remove() or a join of
  // the name ends the mark.
  void mark_elsewhere(const std::string& name) { elsewhere_.insert(name); }
  bool elsewhere(const std::string& name) const { return elsewhere_.count(name) != 0; }
  // Every group leaves the table (engine shutdown).
  Groups take_all();

  // The sequence of a bucket request on group `name` in session `session_id`: `given` when the
  // request carries one, else the next in arrival order (restarting at 0 with each session).
  std::uint64_t sequence(const std::string& name, std::uint64_t session_id,
                         std::optional<std::uint64_t> given);
  // Bucket `sequence` of group `name` was queued: arrival order continues after it.
  void queued(const std::string& name, std::uint64_t sequence);

 private:
  Groups groups_;
  std::set<std::string> joining_;
  std::set<std::string> elsewhere_;
  // Per group name: the session of the last arrival and the next sequence in arrival order.
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> arrivals_;
  std::uint64_t bytes_retired_ = 0;  // received by groups since removed
};

}  // namespace weightcast::sync::engine
