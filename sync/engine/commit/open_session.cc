#include "sync/engine/commit/open_session.h"

#include <utility>

#include "sync/engine/commit/receiver_loader.h"

namespace weightcast::sync::engine {

namespace {

[[noreturn]] void refuse(const Refusal& refusal) {
  throw ReceiverError(refusal.status, refusal.message);
}

}  // namespace

void OpenSession::begin(Selector selector, std::optional<std::string> holder, bool sessionless,
                        std::optional<AdapterTarget> adapter) {
  if (committing_) throw ReceiverError(409, "begin: the previous session is still committing");
  if (adapter) check_adapter_begin(selector, *adapter);
  if (auto refusal = machine_.begin(selector, std::move(holder), sessionless)) refuse(*refusal);
  staging_ = std::make_shared<Staging>(ranks_, distinct_);
  names_.clear();
  class_names_.clear();
  adapter_ = std::move(adapter);
}

Selector OpenSession::check_payload(const std::optional<std::string>& token,
                                    const std::optional<Selector>& selector,
                                    std::string_view route) const {
  if (auto refusal = machine_.check_open(token, route)) refuse(*refusal);
  // A request without a selector (SGLang's body) takes the session's.
  const Selector chosen = selector.value_or(*machine_.selector());
  if (auto refusal = machine_.check_payload(chosen)) refuse(*refusal);
  if (auto refusal = machine_.check_owner(token, route)) refuse(*refusal);
  return chosen;
}

bool OpenSession::discard(std::uint64_t id) {
  if (!machine_.in_session() || machine_.session_id() != id) return false;
  if (staging_) staging_->discard();
  staging_.reset();
  names_.clear();
  class_names_.clear();
  adapter_.reset();
  machine_.close();
  return true;
}

void OpenSession::begin_copy(const std::vector<TensorMeta>& tensors) {
  for (const auto& meta : tensors) names_.insert(meta.name);  // reserved
  ++copies_;
}

bool OpenSession::end_copy(std::uint64_t id, const std::vector<TensorMeta>& tensors, bool staged) {
  --copies_;
  const bool open = machine_.in_session() && machine_.session_id() == id;
  if (open && !staged) {
    for (const auto& meta : tensors) names_.erase(meta.name);
  }
  return open;
}

void OpenSession::check_end(const std::optional<std::string>& token) const {
  if (auto refusal = machine_.check_end()) refuse(*refusal);
  if (auto refusal = machine_.check_owner(token, "end_weight_update")) refuse(*refusal);
}

SessionTaken OpenSession::take(const std::vector<ReceiverRunner>& runners,
                               const std::optional<std::string>& version) {
  if (copies_ > 0) {
    throw ReceiverError(409, "end_weight_update: " + std::to_string(copies_) +
                                 " colocated bucket(s) are still being copied; wait for their "
                                 "responses");
  }
  SessionTaken out;
  out.selector = *machine_.selector();
  out.version = version ? version : machine_.pending_version();
  out.flush = machine_.flush_requested();
  for (const auto& r : runners) {
    if (covers(out.selector, r.id)) out.staged[r.id] = staging_->take(r.id);
  }
  out.adapter = std::move(adapter_);
  adapter_.reset();
  staging_.reset();
  names_.clear();
  class_names_.clear();
  machine_.close();
  committing_ = true;
  return out;
}

}  // namespace weightcast::sync::engine
