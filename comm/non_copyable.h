// NonCopyable: the base of classes whose objects are neither copied nor moved (they own a thread,
// a device context, a codec state or system resources that live at one address). Deriving from
// it deletes the copy operations; since it declares no move operations, the derived class gets
// none either, so a moved-from object can never be left behind.
//
//   class Server : comm::NonCopyable { ... };
//
// Lifetime/threading: no state.
#pragma once

namespace weightcast::comm {

class NonCopyable {
 public:
  NonCopyable(const NonCopyable&) = delete;
  NonCopyable& operator=(const NonCopyable&) = delete;

 protected:
  NonCopyable() = default;
  ~NonCopyable() = default;
};

}  // namespace weightcast::comm
