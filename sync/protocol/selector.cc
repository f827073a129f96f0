#include "sync/protocol/selector.h"

#include "comm/errors.h"

namespace weightcast::sync {

bool covers(Selector selector, Runner runner) {
  switch (selector) {
    case Selector::kAll:
      return true;
    case Selector::kTarget:
      return runner == Runner::kTarget;
    case Selector::kDraft:
      return runner == Runner::kDraft;
  }
  WC_ENFORCE(false, "invalid Selector value ", static_cast<int>(selector));
  return false;
}

std::vector<Runner> covered_runners(Selector selector) {
  std::vector<Runner> out;
  for (Runner r : kAllRunners) {
    if (covers(selector, r)) out.push_back(r);
  }
  return out;
}

}  // namespace weightcast::sync
