#include "sync/protocol/selector.h"

#include <string>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {

Selector parse_selector(std::string_view text) {
  for (Selector s : kAllSelectors) {
    if (text == to_string(s)) return s;
  }
  throw comm::BadRequestError("unknown selector " + quoted(text) + " (valid: all, target, draft)");
}

std::string_view to_string(Selector selector) {
  switch (selector) {
    case Selector::kAll:
      return "all";
    case Selector::kTarget:
      return "target";
    case Selector::kDraft:
      return "draft";
  }
  WC_ENFORCE(false, "invalid Selector value ", static_cast<int>(selector));
  return {};
}

Runner parse_runner(std::string_view text) {
  for (Runner r : kAllRunners) {
    if (text == to_string(r)) return r;
  }
  throw comm::BadRequestError("unknown runner " + quoted(text) + " (valid: target, draft)");
}

std::string_view to_string(Runner runner) {
  switch (runner) {
    case Runner::kTarget:
      return "target";
    case Runner::kDraft:
      return "draft";
  }
  WC_ENFORCE(false, "invalid Runner value ", static_cast<int>(runner));
  return {};
}

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
