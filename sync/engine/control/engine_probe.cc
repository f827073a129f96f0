// GET /spec_accept_length: the speculative accept-length probe on the committed weights.
#include <variant>

#include "sync/engine/control/engine.h"
#include "sync/model/layout.h"
#include "sync/model/spec_probe.h"
#include "sync/protocol/protocol.h"

namespace weightcast::sync::engine {
namespace {

constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kLmHead = "lm_head.weight";
constexpr const char* kDraftFc = "draft.fc.weight";

// The logical bytes of a resident tensor: its runner's layout undone when it was applied, as a
// kernel reading it through that layout would see them.
bool read_logical(const RunnerSet& runners, Runner id, const std::string& name, TensorMeta& meta,
                  std::vector<std::byte>& out) {
  const Layout layout = runners.config(id).layout;
  return runners.with_tensor(id, name, [&](const ResidentTensor& t) {
    meta = t.meta;
    out = t.bytes.to_vector();
    if (t.laid_out) undo_layout(layout, t.meta, out);
  });
}

}  // namespace

Reply Engine::spec_accept_length() const {
  if (!runners_->has(Runner::kDraft) || !runners_->has(Runner::kTarget)) {
    return error_reply(409, "spec_accept_length: needs a target and a draft runner");
  }
  // Digests and version identify the weights the probe would read; reuse the last answer.
  const RunnerChecksum target = runners_->checksum(Runner::kTarget);
  const RunnerChecksum draft = runners_->checksum(Runner::kDraft);
  const std::string key =
      target.weight_version + "/" + to_string(target.combined) + "/" + to_string(draft.combined);
  const auto probed = probe_cache_.get(key, [&]() -> std::variant<Reply, double> {
    TensorMeta embed_meta, head_meta, fc_meta;
    std::vector<std::byte> embed, head, fc;
    if (!read_logical(*runners_, Runner::kTarget, kEmbed, embed_meta, embed) ||
        !read_logical(*runners_, Runner::kDraft, kDraftFc, fc_meta, fc)) {
      return error_reply(409, std::string("spec_accept_length: needs ") + kEmbed +
                                  " in the target and an EAGLE-style " + kDraftFc +
                                  " in the draft");
    }
    if (!read_logical(*runners_, Runner::kTarget, kLmHead, head_meta, head)) {
      head = embed;  // tied embeddings
      head_meta = embed_meta;
    }
    if (embed_meta.shape.size() != 2 || head_meta.shape != embed_meta.shape ||
        fc_meta.shape != std::vector<std::int64_t>{embed_meta.shape[1], 2 * embed_meta.shape[1]} ||
        fc_meta.dtype != embed_meta.dtype) {
      return error_reply(409,
                         "spec_accept_length: embedding, lm_head and draft fc shapes "
                         "or dtypes do not fit together");
    }
    SpecProbeInput in{embed_meta.dtype, embed_meta.shape[0], embed_meta.shape[1], embed, head, fc};
    return run_spec_probe(in).accept_length;
  });
  if (const auto* refusal = std::get_if<Reply>(&probed)) return *refusal;
  SpecAcceptLengthResponse response;
  response.message = "ok";
  response.accept_length = std::get<double>(probed);
  response.draft_tokens = SpecProbeOptions{}.draft_tokens;
  response.weight_version = target.weight_version;
  return {200, to_json_string(response)};
}

}  // namespace weightcast::sync::engine
