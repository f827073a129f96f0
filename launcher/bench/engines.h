// The bench harness's child-process plumbing, shared by every mode that starts engines or child
// benches: temporary files, the model spec engines load, the programs beside this one, and the URL
// an engine prints when it listens.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "launcher/child_process.h"
#include "sync/model/model.h"

namespace weightcast::launcher {

// A file under /tmp holding `text`, removed when this goes out of scope (the model spec engines
// load, the JSON a child bench writes). Throws std::runtime_error when it cannot be written.
class TempFile {
 public:
  TempFile(const std::string& prefix, const std::string& text);
  ~TempFile();
  TempFile(TempFile&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  TempFile& operator=(TempFile&&) = delete;
  const std::string& path() const { return path_; }
  // Stops owning the file (someone else removes it) and returns its path.
  std::string release() { return std::exchange(path_, std::string()); }

 private:
  std::string path_;
};

// The model spec file engines load.
TempFile write_model_spec(std::uint64_t model_bytes);
TempFile write_model_spec(const sync::ModelSpec& spec);
// The program at `relative` from the folder of `self` (this benchmark's path), as the build tree
// lays them out ("engine/weightcast-engine", "train/weightcast-train").
std::string beside_self(const std::string& self, const std::string& relative);
// The URL an engine prints when it listens.
std::string engine_url(ChildProcess& engine, std::chrono::milliseconds timeout);
// How the benches start their engines: killed with the bench, even by a signal that skips its
// destructors (a bench piped into `head`, or killed), so no engine outlives it holding memory.
ChildOptions engine_child();

}  // namespace weightcast::launcher
