#include "sync/engine/commit/receiver_state.h"

namespace weightcast::sync::engine {

bool ReceiverState::fail_session_locked(std::uint64_t session_id, bool abort_busy_groups,
                                        int status, const std::string& reason,
                                        bool abort_used_groups) {
  if (!session.discard(session_id)) return false;
  for (auto& [name, group] : groups.all()) {
    if ((abort_busy_groups && group->busy()) || (abort_used_groups && group->used_in(session_id))) {
      group->abort(status, "session failed: " + reason);
    }
  }
  return true;
}

}  // namespace weightcast::sync::engine
