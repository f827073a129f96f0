#include "launcher/bench/engines.h"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "sync/model/model.h"

namespace weightcast::launcher {

TempFile::TempFile(const std::string& prefix, const std::string& text) {
  std::string path = "/tmp/" + prefix + "-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) throw std::runtime_error("cannot create a temporary file " + path);
  path_ = path;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok) throw std::runtime_error("cannot write the temporary file " + path_);
}

TempFile::~TempFile() {
  if (!path_.empty()) unlink(path_.c_str());
}

TempFile write_model_spec(std::uint64_t model_bytes) {
  return write_model_spec(sync::model_spec_for_bytes(model_bytes));
}

TempFile write_model_spec(const sync::ModelSpec& spec) {
  return TempFile("weightcast-bench-model", sync::to_json(spec).dump());
}

std::string beside_self(const std::string& self, const std::string& relative) {
  const auto slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string(".") : self.substr(0, slash);
  return dir + "/" + relative;
}

ChildOptions engine_child() {
  ChildOptions options;
  options.die_with_parent = true;
  return options;
}

std::string engine_url(ChildProcess& engine, std::chrono::milliseconds timeout) {
  const std::string l = engine.line(timeout, "weightcast-engine");
  const auto at = l.find("http://");
  if (at == std::string::npos) throw std::runtime_error("engine said: " + l);
  return l.substr(at);
}

}  // namespace weightcast::launcher
