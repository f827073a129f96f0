#include "launcher/bench/table.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "comm/errors.h"

namespace weightcast::launcher {
namespace {

std::string cell_text(const BenchTable::Cell& cell, int precision) {
  if (const auto* s = std::get_if<std::string>(&cell)) return *s;
  if (const auto* u = std::get_if<std::uint64_t>(&cell)) return std::to_string(*u);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, std::get<double>(cell));
  return buf;
}

nlohmann::json cell_json(const BenchTable::Cell& cell) {
  if (const auto* s = std::get_if<std::string>(&cell)) return *s;
  if (const auto* u = std::get_if<std::uint64_t>(&cell)) return *u;
  return std::get<double>(cell);
}

// RFC 4180: quote fields holding a comma, a quote or a line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.good()) throw std::runtime_error("cannot write benchmark results to '" + path + "'");
}

}  // namespace

BenchTable::BenchTable(std::string mode, std::vector<BenchColumn> columns, int wrong_width)
    : mode_(std::move(mode)), columns_(std::move(columns)) {
  columns_.push_back({"#wrong", wrong_width, 0});
}

void BenchTable::note(const std::string& text) {
  notes_.push_back(text);
  std::printf("# %s\n", text.c_str());
  std::fflush(stdout);
}

void BenchTable::print_header() const {
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    std::printf(i ? " %*s" : "%*s", columns_[i].width, columns_[i].name.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

void BenchTable::begin(const std::string& head) {
  note(head);
  print_header();
}

void BenchTable::add(std::vector<Cell> cells, std::uint64_t wrong) {
  cells.emplace_back(wrong);
  wrong_ += wrong;
  WC_ENFORCE_EQ(cells.size(), columns_.size(), "cells in a bench row");
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const std::string text = cell_text(cells[i], columns_[i].precision);
    std::printf(i ? " %*s" : "%*s", columns_[i].width, text.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
  rows_.push_back(std::move(cells));
}

void BenchTable::write(const BenchOutput& out) const {
  if (!out.csv_path.empty()) {
    std::string text;
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      text += (i ? "," : "") + csv_field(columns_[i].name);
    }
    text += "\n";
    for (const auto& row : rows_) {
      for (std::size_t i = 0; i < row.size(); ++i) {
        text += (i ? "," : "") + csv_field(cell_text(row[i], 6));
      }
      text += "\n";
    }
    write_file(out.csv_path, text);
  }
  if (!out.json_path.empty()) {
    nlohmann::json j = {{"mode", mode_}, {"notes", notes_}};
    j["columns"] = nlohmann::json::array();
    for (const auto& c : columns_) j["columns"].push_back(c.name);
    j["rows"] = nlohmann::json::array();
    for (const auto& row : rows_) {
      nlohmann::json r = nlohmann::json::object();
      for (std::size_t i = 0; i < row.size(); ++i) r[columns_[i].name] = cell_json(row[i]);
      j["rows"].push_back(std::move(r));
    }
    write_file(out.json_path, j.dump(2) + "\n");
  }
}

void fill_pattern(std::span<std::uint8_t> out, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < out.size(); i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<std::size_t>(8, out.size() - i));
  }
}

std::uint64_t count_wrong(std::span<const std::uint8_t> got, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); i += 8) {
    const std::uint64_t v = rng();
    std::uint8_t expect[8];
    std::memcpy(expect, &v, 8);
    const std::size_t n = std::min<std::size_t>(8, got.size() - i);
    for (std::size_t k = 0; k < n; ++k) wrong += got[i + k] != expect[k];
  }
  return wrong;
}

}  // namespace weightcast::launcher
