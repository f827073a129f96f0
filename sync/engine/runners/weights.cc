#include "sync/engine/runners/weights.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "comm/enum_names.h"
#include "comm/errors.h"

namespace weightcast::sync::engine {

namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

// safetensors dtype codes ("F32", "BF16", ...), one per row of the list of dtypes.
constexpr std::pair<DType, std::string_view> kCodeEntries[] = {
#define WEIGHTCAST_DTYPE(enumerator, name, size, code) {DType::enumerator, code},
#include "sync/protocol/dtypes.def"
};
constexpr auto kCodes = comm::enum_names<DType>("safetensors dtype", kCodeEntries);

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw comm::ConfigError("safetensors file '" + path + "': " + what);
}

// Where the tensors' bytes are: the file's JSON header and its data section.
struct Layout {
  nlohmann::json header;
  std::uint64_t data_start = 0;
  std::uint64_t data_size = 0;
};

// Reads the length-prefixed header of the file `in` has open (at its end: ios::ate).
Layout read_layout(std::ifstream& in, const std::string& path, std::size_t max_bytes) {
  const auto file_size = static_cast<std::uint64_t>(in.tellg());
  if (file_size > max_bytes) {
    bad_file(path,
             std::to_string(file_size) + " bytes, over the limit of " + std::to_string(max_bytes));
  }
  if (file_size < 8) bad_file(path, "shorter than its 8-byte header length");
  in.seekg(0);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    bad_file(path, "header length " + std::to_string(header_len) + " does not fit the file");
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  Layout layout;
  layout.data_start = 8 + header_len;
  layout.data_size = file_size - layout.data_start;
  try {
    layout.header = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    bad_file(path, std::string("header is not JSON: ") + e.what());
  }
  if (!layout.header.is_object()) bad_file(path, "header is not a JSON object");
  return layout;
}

// One tensor of the header: its meta and its bytes' offsets in the data section.
struct Entry {
  TensorMeta meta;
  std::uint64_t begin, end;
};

// The header entry `name`, checked against its dtype, shape and the data section.
Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& value,
                  std::uint64_t data_size) {
  const std::string where = "tensor '" + name + "'";
  try {
    validate_tensor_name(name, "name");
    const std::string code = value.at("dtype").get<std::string>();
    const auto dtype = kCodes.find(code);
    if (!dtype) bad_file(path, where + ": unsupported dtype '" + code + "'");
    Entry e{TensorMeta{name, *dtype, value.at("shape").get<std::vector<std::int64_t>>()}, 0, 0};
    const auto offsets = value.at("data_offsets").get<std::vector<std::uint64_t>>();
    if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size) {
      bad_file(path, where + ": data_offsets outside the data");
    }
    e.begin = offsets[0];
    e.end = offsets[1];
    if (e.end - e.begin != e.meta.byte_count()) {
      bad_file(path, where + ": " + std::to_string(e.end - e.begin) +
                         " bytes do not match its dtype and shape");
    }
    return e;
  } catch (const comm::ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    bad_file(path, where + ": " + e.what());
  }
}

// Every tensor of the header (metadata aside), in file order; none may overlap another.
std::vector<Entry> parse_entries(const std::string& path, const Layout& layout) {
  std::vector<Entry> entries;
  for (const auto& [name, value] : layout.header.items()) {
    if (name == "__metadata__") continue;
    entries.push_back(parse_entry(path, name, value, layout.data_size));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      bad_file(path, "tensors '" + entries[i - 1].meta.name + "' and '" + entries[i].meta.name +
                         "' overlap");
    }
  }
  return entries;
}

}  // namespace

std::vector<RawTensor> generate_weights(const std::vector<TensorMeta>& metas, std::uint64_t seed,
                                        std::uint64_t step) {
  std::vector<RawTensor> out;
  out.reserve(metas.size());
  for (const auto& meta : metas) {
    RawTensor t{meta, std::vector<std::byte>(meta.byte_count())};
    fill_tensor(t.meta, seed, step, t.bytes);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<TensorMeta> runner_tensors(Runner runner, const ModelSpec& spec) {
  return runner == Runner::kTarget ? target_tensors(spec) : draft_tensors(spec);
}

std::vector<RawTensor> load_safetensors(const std::string& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) bad_file(path, "cannot open");
  const Layout layout = read_layout(in, path, max_bytes);
  std::vector<Entry> entries = parse_entries(path, layout);
  std::vector<RawTensor> out;
  for (auto& e : entries) {
    RawTensor t{std::move(e.meta), std::vector<std::byte>(e.end - e.begin)};
    in.seekg(static_cast<std::streamoff>(layout.data_start + e.begin));
    in.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    if (!in) bad_file(path, "short read in tensor '" + t.meta.name + "'");
    out.push_back(std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    WC_ENFORCE_EQ(t.bytes.size(), t.meta.byte_count(), "tensor '", t.meta.name, "'");
    header[t.meta.name] = {{"dtype", kCodes.name_or(t.meta.dtype, "?")},
                           {"shape", t.meta.shape},
                           {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  const std::string text = header.dump();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw comm::ConfigError("cannot write '" + path + "'");
  std::uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  if (!out) throw comm::ConfigError("short write to '" + path + "'");
}

}  // namespace weightcast::sync::engine
