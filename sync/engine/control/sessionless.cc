#include "sync/engine/control/sessionless.h"

#include <string>

namespace weightcast::sync::engine {

std::variant<Refusal, Selector> sessionless_scope(const std::vector<Runner>& held,
                                                  std::optional<Selector> asked,
                                                  const SessionlessRules& rules) {
  const Selector selector = asked.value_or(Selector::kAll);
  bool target = false;
  bool draft = false;
  std::string skipped;
  for (Runner runner : held) {
    if (!covers(selector, runner)) continue;
    if (rules.frozen.count(runner) && !rules.touch_frozen) {
      skipped += (skipped.empty() ? "'" : ", '") + std::string(to_string(runner)) + "'";
      continue;
    }
    (runner == Runner::kTarget ? target : draft) = true;
  }
  if (target && draft) return Selector::kAll;
  if (target) return Selector::kTarget;
  if (draft) return Selector::kDraft;
  return Refusal{400, "selector: '" + std::string(to_string(selector)) +
                          "' leaves no runner for a sessionless update" +
                          (skipped.empty() ? std::string()
                                           : " (" + skipped +
                                                 " frozen: open a session with "
                                                 "begin_weight_update to update it)")};
}

}  // namespace weightcast::sync::engine
