#include "comm/errors.h"

namespace weightcast::comm::detail {

void enforce_fail(const char* file, int line, const char* expr, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": enforce failed: " << expr;
  if (!msg.empty()) os << ": " << msg;
  throw EnforceError(os.str());
}

}  // namespace weightcast::comm::detail
