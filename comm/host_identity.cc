#include "comm/host_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace weightcast::comm {

std::string host_identity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!(boot >> boot_id)) return {};
  std::ostringstream os;
  os << boot_id;
  for (const char* ns : {"/proc/self/ns/net", "/proc/self/ns/pid"}) {
    struct stat st {};
    if (::stat(ns, &st) != 0) return {};
    os << '/' << st.st_dev << ':' << st.st_ino;
  }
  os << '/' << ::getuid();
  return os.str();
}

}  // namespace weightcast::comm
