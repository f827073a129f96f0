#include "sync/model/name_filter.h"

#include <fnmatch.h>

#include "comm/errors.h"
#include "sync/protocol/protocol_text.h"

namespace weightcast::sync {

NameFilter NameFilter::parse(std::string_view text, std::string_view field) {
  NameFilter filter;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view glob = text.substr(start, comma - start);
    if (!glob.empty()) {
      validate_identifier(glob, 1024,
                          std::string(field) + "[" + std::to_string(filter.globs_.size()) + "]");
      filter.globs_.emplace_back(glob);
    }
    start = comma + 1;
  }
  return filter;
}

NameFilter NameFilter::from_globs(const std::vector<std::string>& globs, std::string_view field) {
  NameFilter filter;
  for (const auto& glob : globs) {
    if (glob.empty()) continue;
    validate_identifier(glob, 1024,
                        std::string(field) + "[" + std::to_string(filter.globs_.size()) + "]");
    filter.globs_.push_back(glob);
  }
  return filter;
}

bool NameFilter::accepts(std::string_view name) const {
  // Globs that are a literal text, or a literal prefix and one trailing '*' ("model.*", the
  // runners' defaults), are matched here as fnmatch would, without its copy of the name: this
  // runs for every tensor of every bucket. Other globs go to fnmatch, which needs NUL-terminated
  // text.
  std::string subject;
  for (const auto& glob : globs_) {
    const std::string_view g(glob);
    const auto special = g.find_first_of("*?[\\");
    if (special == std::string_view::npos) {
      if (name == g) return true;
      continue;
    }
    if (special == g.size() - 1 && g.back() == '*') {
      if (name.starts_with(g.substr(0, special))) return true;
      continue;
    }
    if (subject.empty()) subject.assign(name);
    if (fnmatch(glob.c_str(), subject.c_str(), 0) == 0) return true;
  }
  return false;
}

std::string NameFilter::text() const {
  std::string out;
  for (const auto& glob : globs_) {
    if (!out.empty()) out += ',';
    out += glob;
  }
  return out;
}

}  // namespace weightcast::sync
