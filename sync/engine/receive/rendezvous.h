// How an engine rank meets its weight-update group: which store the source hosts, and the
// communicator each engine rank forms through it.
//
// Two rendezvous kinds (init_weights_update_group's "rendezvous", docs/protocol.md):
//   weightcast  our TcpStore (token-checked) at master_address:master_port; the group runs our
//               chain broadcast (native mode).
//   torch       a torch c10d TCPStore there ("torch1"/"torch2": of that generation, else the
//               generation the store answers in); each engine rank joins as a torch worker (ADD
//               "init/"), uses the key chain of SGLang's init_custom_process_group and forms a
//               torch-compatible group, so a torch trainer's dist.broadcast meets our receive.
// When the request names none (what SGLang and Miles send), detect_rendezvous() asks the store
// for our HELLO under a short sub-deadline: an answer means weightcast; a dropped, stalled or
// garbled answer, or nothing listening yet (a torch master starts its store after sending the
// init request), means torch, tried with the rest of the init deadline.
// Lifetime/threading: free functions; join_rank() is called by one thread per engine rank.
#pragma once

#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "comm/deadline.h"
#include "comm/store/c10d_store.h"
#include "sync/engine/receive/channel.h"

namespace weightcast::sync::engine {

struct RendezvousPlan {
  Rendezvous kind = Rendezvous::kWeightcast;
  comm::C10dProtocol protocol = comm::C10dProtocol::kAuto;  // torch only; kAuto: each rank detects
};

// The sub-deadline of the HELLO probe: a quarter of the init deadline, at most 2 s.
comm::Millis probe_budget(comm::Millis init_timeout);

// Resolves spec.rendezvous: given -> as given; absent -> the probe described above. Throws
// comm::ConfigError when our store refused the configured token (that store is ours: no
// fallback).
RendezvousPlan detect_rendezvous(const GroupSpec& spec, const ConnectOptions& opts,
                                 comm::Deadline deadline);

// Joins engine rank `engine_rank` (group rank rank_offset + engine_rank) to the group and returns
// its communicator, bounded by `deadline`.
std::unique_ptr<comm::Communicator> join_rank(const GroupSpec& spec, const ConnectOptions& opts,
                                              const RendezvousPlan& plan, int engine_rank,
                                              comm::Deadline deadline);

}  // namespace weightcast::sync::engine
