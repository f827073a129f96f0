// The benchmark harness every weightcast-bench mode prints and saves its results through: an
// nccl-tests-style table printed row by row as results come in, the "# ..." notes around it, and
// on request the same rows as CSV (--csv FILE) and JSON (--json FILE) for plots and tooling
// (scripts/plot-bench.py). Every table ends in a "#wrong" column, which it totals for the mode's
// exit status. Plus the fill/check byte patterns the modes use to count #wrong.
//
// JSON: {"mode": ..., "columns": [...], "rows": [{column: value, ...}, ...], "notes": [...]};
// numbers stay numbers. CSV: a header row, then one line per row, notes omitted.
// Lifetime: one table per mode run. Threading: one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace weightcast::launcher {

struct BenchOutput {
  std::string csv_path;   // empty: no CSV
  std::string json_path;  // empty: no JSON
};

struct BenchColumn {
  std::string name;
  int width = 12;
  int precision = 3;  // digits after the point for floating-point cells
};

class BenchTable {
 public:
  using Cell = std::variant<std::string, double, std::uint64_t>;

  // `columns` are followed by the "#wrong" column, `wrong_width` wide.
  BenchTable(std::string mode, std::vector<BenchColumn> columns, int wrong_width = 7);

  // "# text" on stdout, kept for the JSON notes.
  void note(const std::string& text);
  void print_header() const;
  // The mode's first note, then the header.
  void begin(const std::string& head);
  // Prints the row (cells in column order, their count matching the columns, then `wrong`) and
  // keeps it.
  void add(std::vector<Cell> cells, std::uint64_t wrong);
  // The sum of the "#wrong" column so far.
  std::uint64_t wrong() const { return wrong_; }
  // Writes the CSV and/or JSON files `out` names. Throws std::runtime_error naming the file on
  // failure.
  void write(const BenchOutput& out) const;

  const std::vector<std::vector<Cell>>& rows() const { return rows_; }

 private:
  std::string mode_;
  std::vector<BenchColumn> columns_;
  std::vector<std::vector<Cell>> rows_;
  std::vector<std::string> notes_;
  std::uint64_t wrong_ = 0;
};

// Pseudo-random bytes from `seed` (the sender's data), and the count of bytes of `got` that
// differ from what fill_pattern(seed) writes (a receiver's check).
void fill_pattern(std::span<std::uint8_t> out, std::uint64_t seed);
std::uint64_t count_wrong(std::span<const std::uint8_t> got, std::uint64_t seed);

}  // namespace weightcast::launcher
