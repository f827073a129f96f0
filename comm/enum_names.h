// Names of small closed enums, one table per enum for both directions: value -> name (wire
// spellings, log and error messages) and name -> value (parsing), plus the list of valid names
// that parse errors show. Callers choose the error a bad name raises: the wire vocabulary's
// parse_name() (sync/protocol/protocol_text.h) throws BadRequestError with the value quoted.
//
//   constexpr auto kModes = enum_names<Mode>("mode", {{Mode::kA, "a"}, {Mode::kB, "b"}});
//   kModes.name(Mode::kB) == "b";  kModes.find("a") == Mode::kA;  kModes.list() == "a, b";
//   kModes.values() == std::array{Mode::kA, Mode::kB}
//
// Lifetime/threading: constexpr values and pure functions; safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "comm/errors.h"

namespace weightcast::comm {

template <typename E, std::size_t N>
class EnumNames {
 public:
  using Entry = std::pair<E, std::string_view>;

  constexpr EnumNames(std::string_view kind, const std::array<Entry, N>& entries)
      : kind_(kind), entries_(entries) {}

  // What the enum names ("backend", "pause mode"), for messages.
  constexpr std::string_view kind() const { return kind_; }

  // The name of `value`; a value outside the table (a corrupt enum) throws EnforceError.
  std::string_view name(E value) const {
    if (auto n = find_name(value)) return *n;
    WC_ENFORCE(false, "invalid ", kind_, " value ", static_cast<long long>(value));
    return {};
  }
  // The name of `value`, or `fallback` for a value outside the table.
  constexpr std::string_view name_or(E value, std::string_view fallback) const {
    return find_name(value).value_or(fallback);
  }

  // The value named exactly `text`, if any.
  constexpr std::optional<E> find(std::string_view text) const {
    for (const auto& [value, name] : entries_) {
      if (name == text) return value;
    }
    return std::nullopt;
  }

  // The values in table order.
  constexpr std::array<E, N> values() const {
    std::array<E, N> out{};
    for (std::size_t i = 0; i < N; ++i) out[i] = entries_[i].first;
    return out;
  }

  // The names in table order, comma separated: "nccl, gloo".
  std::string list() const {
    std::string out;
    for (const auto& entry : entries_) {
      if (!out.empty()) out += ", ";
      out += entry.second;
    }
    return out;
  }

 private:
  constexpr std::optional<std::string_view> find_name(E value) const {
    for (const auto& [v, name] : entries_) {
      if (v == value) return name;
    }
    return std::nullopt;
  }

  std::string_view kind_;
  std::array<Entry, N> entries_;
};

// Builds an EnumNames, counting the entries: enum_names<Mode>("mode", {{Mode::kA, "a"}, ...}).
template <typename E, std::size_t N>
constexpr EnumNames<E, N> enum_names(std::string_view kind,
                                     const std::pair<E, std::string_view> (&entries)[N]) {
  return EnumNames<E, N>(kind, std::to_array(entries));
}

}  // namespace weightcast::comm
