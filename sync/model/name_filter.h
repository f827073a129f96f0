// NameFilter: which incoming tensor names a runner loads. The engine applies it to what it
// receives; the trainer's verification (sync/trainer/verify.h) applies the same code to the
// filters /server_info reports, so both sides decide alike.
//
// A filter is a comma-separated list of fnmatch(3) globs ("*", "model.*,lm_head.weight",
// "mtp.*"); a name is accepted when any glob matches it. An empty list accepts nothing, which is
// how a runner that must never load (a frozen draft) is configured explicitly. Globs are matched
// without FNM_PATHNAME, so '*' also crosses the '.' separators of parameter names.
// Lifetime/threading: an immutable value; safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace weightcast::sync {

class NameFilter {
 public:
  // Splits `text` at commas and drops empty items. Throws comm::BadRequestError (naming
  // `field`) on a glob with whitespace or control bytes, which no parameter name contains.
  static NameFilter parse(std::string_view text, std::string_view field = "filter");
  // The same from globs already split (RunnerInfo::filters), with the same checks.
  static NameFilter from_globs(const std::vector<std::string>& globs,
                               std::string_view field = "filter");

  bool accepts(std::string_view name) const;
  const std::vector<std::string>& globs() const { return globs_; }
  // The globs joined with commas, as reported by /server_info.
  std::string text() const;

 private:
  std::vector<std::string> globs_;
};

}  // namespace weightcast::sync
