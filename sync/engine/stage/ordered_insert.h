// Lookups in a std::map walked in key order: when a caller visits keys in increasing order (as
// another std::map iterates them), each lookup can start right after the previous one instead of
// at the root. A commit of an MoE model does this for thousands of tensor names.
// Threading: none of its own; the caller owns the map.
#pragma once

#include <iterator>
#include <string>

namespace weightcast::sync::engine {

// The entry of `key` in `map`, inserted (value-initialized) if missing, looked up from `hint`: the
// entry after the previous key. A wrong hint costs a normal lookup, never a wrong answer.
template <typename Map>
typename Map::iterator place_in_order(Map& map, typename Map::iterator hint,
                                      const std::string& key) {
  if (hint != map.end() && hint->first == key) return hint;  // an update of the next entry
  return map.try_emplace(hint, key);  // amortized constant when the hint is right
}

}  // namespace weightcast::sync::engine
