#include "launcher/train/rank_messages.h"

#include <nlohmann/json.hpp>

#include "comm/errors.h"
#include "comm/mpi/mpi_helpers.h"

namespace weightcast::launcher::train {

namespace {

// Reads a broadcast message with `parse`, naming the root when it does not read back.
template <typename T, typename Parse>
T read_from(int root, const std::string& text, Parse&& parse) {
  try {
    return parse(text);
  } catch (const std::exception& e) {
    throw comm::PeerError("trainer rank " + std::to_string(root),
                          std::string("a message that does not read back: ") + e.what());
  }
}

}  // namespace

std::string to_json_text(const RankStatus& status) {
  return nlohmann::json{{"code", status.code}, {"text", status.text}}.dump();
}

RankStatus parse_rank_status(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("code") || !j["code"].is_number_integer() ||
      !j.contains("text") || !j["text"].is_string()) {
    throw comm::BadRequestError("rank status: expected {\"code\": int, \"text\": string}");
  }
  return {j["code"].get<int>(), j["text"].get<std::string>()};
}

RankStatus broadcast_status(MPI_Comm comm, int root, const RankStatus& value,
                            comm::Deadline deadline) {
  const std::string text = comm::mpi::broadcast_string(comm, root, to_json_text(value), deadline);
  return read_from<RankStatus>(root, text, parse_rank_status);
}

AttemptNext broadcast_next(MPI_Comm comm, int root, AttemptNext value, comm::Deadline deadline) {
  const std::string text = comm::mpi::broadcast_string(
      comm, root, value == AttemptNext::kRetry ? "retry" : "done", deadline);
  return read_from<AttemptNext>(root, text, [](const std::string& t) {
    if (t != "retry" && t != "done") throw comm::BadRequestError("'" + t + "'");
    return t == "retry" ? AttemptNext::kRetry : AttemptNext::kDone;
  });
}

sync::trainer::StageOutcome broadcast_outcome(MPI_Comm comm, int root,
                                              const sync::trainer::StageOutcome& value,
                                              comm::Deadline deadline) {
  const std::string text =
      comm::mpi::broadcast_string(comm, root, sync::trainer::to_text(value), deadline);
  return read_from<sync::trainer::StageOutcome>(
      root, text, [](const std::string& t) { return sync::trainer::parse_stage_outcome(t); });
}

}  // namespace weightcast::launcher::train
