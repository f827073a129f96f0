// Colocated transport: passing a segment's descriptor to a same-host engine rank.
//
// send_handle() writes one message on a connected AF_UNIX stream socket: the session token and
// the segment size as text ("<token> <size>"), with the read-only descriptor attached as
// SCM_RIGHTS. receive_handle() waits at most `timeout` for it, refuses a peer whose uid
// (SO_PEERCRED) differs from ours, a message without exactly one descriptor, or a token that is
// not the session's, and closes any descriptor it refuses. Nothing is deserialized as code.
// fetch_handle() is the engine's whole side: it connects to the abstract socket a SegmentServer
// (comm/colocate/segment_server.h) listens on and receives the handle there.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include <sys/socket.h>
#include <sys/un.h>

namespace weightcast::comm::colocate {

struct ReceivedHandle {
  int fd = -1;  // owned by the caller
  std::size_t size = 0;
};

// Throws comm::Error if the send fails.
void send_handle(int socket_fd, const std::string& token, int segment_fd, std::size_t size);

// Throws comm::TimeoutError past `timeout`, comm::Error on a refused or malformed message.
ReceivedHandle receive_handle(int socket_fd, const std::string& expected_token,
                              std::chrono::milliseconds timeout);

// The address of the abstract AF_UNIX name `name` (no leading NUL; nothing in the file system).
// Throws comm::Error when the name does not fit.
struct AbstractAddress {
  sockaddr_un addr{};
  socklen_t length = 0;
};
AbstractAddress abstract_address(const std::string& name);

// Connects to the abstract socket `name` and receive_handle()s there. Throws comm::Error naming
// `name` when nothing listens on it, and as receive_handle() does.
ReceivedHandle fetch_handle(const std::string& name, const std::string& expected_token,
                            std::chrono::milliseconds timeout);

// fetch_handle(), leaving the connection open (owned by the caller): the trainer closes it when
// the segment is gone (segment_server.h), which is how an engine knows to drop a mapping it kept.
struct HeldHandle {
  ReceivedHandle handle;
  int connection = -1;
};
HeldHandle fetch_and_hold(const std::string& name, const std::string& expected_token,
                          std::chrono::milliseconds timeout);

}  // namespace weightcast::comm::colocate
