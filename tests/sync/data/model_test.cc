#include "sync/model/model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/model/checksum.h"
#include "sync/model/layout.h"

namespace weightcast::sync {
namespace {

using Bytes = std::vector<std::byte>;

Bytes generate(const TensorMeta& meta, std::uint64_t seed, std::uint64_t step) {
  Bytes out(meta.byte_count());
  fill_tensor(meta, seed, step, out);
  return out;
}

std::vector<std::string> names(const std::vector<TensorMeta>& metas) {
  std::vector<std::string> out;
  for (const auto& m : metas) out.push_back(m.name);
  return out;
}

const std::vector<std::string> kLayerSuffixes = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

TEST(HfTensors, TinyModelNamesShapesAndOrder) {
  const ModelSpec spec = model_preset("tiny");
  const auto metas = hf_tensors(spec);
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (int i = 0; i < spec.num_layers; ++i) {
    for (const auto& s : kLayerSuffixes)
      expected.push_back("model.layers." + std::to_string(i) + "." + s);
  }
  expected.push_back("model.norm.weight");
  expected.push_back("lm_head.weight");
  EXPECT_EQ(names(metas), expected);

  const auto shape_of = [&](const std::string& name) {
    for (const auto& m : metas) {
      if (m.name == name) return m.shape;
    }
    return std::vector<std::int64_t>{-1};
  };
  using S = std::vector<std::int64_t>;
  EXPECT_EQ(shape_of("model.embed_tokens.weight"), (S{1024, 256}));
  EXPECT_EQ(shape_of("model.layers.1.input_layernorm.weight"), (S{256}));
  EXPECT_EQ(shape_of("model.layers.1.self_attn.q_proj.weight"), (S{256, 256}));
  EXPECT_EQ(shape_of("model.layers.1.self_attn.k_proj.weight"), (S{128, 256}));
  EXPECT_EQ(shape_of("model.layers.1.self_attn.o_proj.weight"), (S{256, 256}));
  EXPECT_EQ(shape_of("model.layers.0.mlp.gate_proj.weight"), (S{512, 256}));
  EXPECT_EQ(shape_of("model.layers.0.mlp.down_proj.weight"), (S{256, 512}));
  EXPECT_EQ(shape_of("lm_head.weight"), (S{1024, 256}));
  for (const auto& m : metas) EXPECT_EQ(m.dtype, DType::kBFloat16) << m.name;
  EXPECT_EQ(target_tensors(spec), metas);
}

TEST(HfTensors, TiedEmbeddingsDropLmHead) {
  ModelSpec spec = model_preset("tiny");
  spec.tie_word_embeddings = true;
  const auto metas = hf_tensors(spec);
  EXPECT_EQ(metas.size(), 1u + 9u * 2u + 1u);
  EXPECT_EQ(metas.back().name, "model.norm.weight");
}

TEST(HfTensors, MtpModuleFollowsTheModelAndIsTheDraft) {
  ModelSpec spec = model_preset("tiny");
  spec.mtp_num_layers = 2;
  const auto all = hf_tensors(spec);
  const auto target = target_tensors(spec);
  ASSERT_EQ(all.size(), target.size() + 3 + 9 * 2 + 1);
  EXPECT_TRUE(std::equal(target.begin(), target.end(), all.begin()));
  const std::vector<TensorMeta> mtp(all.begin() + static_cast<std::ptrdiff_t>(target.size()),
                                    all.end());
  for (const auto& m : mtp) EXPECT_TRUE(m.name.starts_with(kMtpPrefix)) << m.name;
  for (const auto& m : target) EXPECT_FALSE(m.name.starts_with(kMtpPrefix)) << m.name;
  EXPECT_EQ(mtp.front().name, "mtp.fc.weight");
  EXPECT_EQ(mtp.front().shape, (std::vector<std::int64_t>{256, 512}));
  EXPECT_EQ(mtp[3].name, "mtp.layers.0.input_layernorm.weight");
  EXPECT_EQ(mtp[3 + 9].name, "mtp.layers.1.input_layernorm.weight");
  EXPECT_EQ(mtp.back().name, "mtp.norm.weight");
  EXPECT_EQ(draft_tensors(spec), mtp);
}

TEST(HfTensors, FrozenDraftHasItsOwnNames) {
  const ModelSpec spec = model_preset("tiny");
  const auto draft = draft_tensors(spec);
  ASSERT_EQ(draft.size(), 1u + 9u + 1u);
  EXPECT_EQ(draft.front().name, "draft.fc.weight");
  EXPECT_EQ(draft[1].name, "draft.layers.0.input_layernorm.weight");
  EXPECT_EQ(draft.back().name, "draft.norm.weight");
  std::set<std::string> target_names;
  for (const auto& m : hf_tensors(spec)) target_names.insert(m.name);
  for (const auto& m : draft) {
    EXPECT_TRUE(m.name.starts_with(kDraftPrefix)) << m.name;
    EXPECT_EQ(target_names.count(m.name), 0u) << m.name;
  }
}

TEST(ModelSpec, PresetSizes) {
  for (auto name : model_preset_names()) {
    const ModelSpec spec = model_preset(name);
    const auto metas = hf_tensors(spec);
    std::printf("preset %-12s %4zu tensors %10.1f MiB\n", std::string(name).c_str(), metas.size(),
                static_cast<double>(total_bytes(metas)) / (1 << 20));
  }
  const double tiny = static_cast<double>(total_bytes(hf_tensors(model_preset("tiny"))));
  EXPECT_GT(tiny, 2.0 * (1 << 20));
  EXPECT_LT(tiny, 8.0 * (1 << 20));
  const double small = static_cast<double>(total_bytes(hf_tensors(model_preset("small"))));
  EXPECT_GT(small, 60.0 * (1 << 20));
  EXPECT_LT(small, 68.0 * (1 << 20));
  EXPECT_THROW(model_preset("huge"), comm::ConfigError);
}

TEST(ModelSpec, SizedForBytes) {
  const std::size_t mib = 1 << 20;
  const ModelSpec smallest = model_spec_for_bytes(0);
  EXPECT_EQ(smallest.num_layers, 1);
  const std::size_t floor_bytes = total_bytes(hf_tensors(smallest));
  for (std::size_t target : {10 * mib, 64 * mib, 300 * mib, 1024 * mib, 8192 * mib}) {
    ASSERT_GE(target, floor_bytes);
    ModelSpec spec = model_spec_for_bytes(target);
    const std::size_t got = total_bytes(hf_tensors(spec));
    spec.num_layers += 1;
    const std::size_t one_more = total_bytes(hf_tensors(spec));
    EXPECT_LE(got, target);
    EXPECT_GT(one_more, target) << "a layer more would still fit";
  }
  EXPECT_EQ(model_spec_for_bytes(64 * mib, DType::kFloat32).dtype, DType::kFloat32);
}

TEST(ModelSpec, JsonRoundTripAndRealConfig) {
  for (auto name : model_preset_names()) {
    ModelSpec spec = model_preset(name);
    spec.mtp_num_layers = 1;
    EXPECT_EQ(model_spec_from_json(to_json(spec)), spec) << name;
  }
  // Abridged from the Qwen3-0.6B config.json, extra keys included.
  const auto real = nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 151936})");
  EXPECT_EQ(model_spec_from_json(real), model_preset("qwen3-0.6b"));

  const auto minimal = nlohmann::json::parse(R"({"vocab_size": 100, "hidden_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128})");
  const ModelSpec m = model_spec_from_json(minimal);
  EXPECT_EQ(m.num_key_value_heads, 4);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.mtp_num_layers, 0);
  EXPECT_EQ(m.dtype, DType::kBFloat16);
  EXPECT_FALSE(m.tie_word_embeddings);
}

TEST(HfTensors, MoeLayerInQwen3MoeNaming) {
  const ModelSpec spec = model_preset("moe-small");
  const auto metas = hf_tensors(spec);
  std::vector<std::string> layer;  // layer 1's tensors
  for (const auto& m : metas) {
    if (m.name.starts_with("model.layers.1.")) layer.push_back(m.name.substr(15));
  }
  std::vector<std::string> expected = {"input_layernorm.weight",  "self_attn.q_proj.weight",
                                       "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                       "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                       "mlp.gate.weight"};
  for (int e = 0; e < 16; ++e) {
    for (const char* m : {"gate_proj", "up_proj", "down_proj"}) {
      expected.push_back("mlp.experts." + std::to_string(e) + "." + m + ".weight");
    }
  }
  for (const char* m : {"gate_proj", "up_proj", "down_proj"}) {
    expected.push_back(std::string("mlp.shared_expert.") + m + ".weight");
  }
  expected.push_back("mlp.shared_expert_gate.weight");
  EXPECT_EQ(layer, expected);
  const auto shape_of = [&](const std::string& name) {
    for (const auto& m : metas) {
      if (m.name == name) return m.shape;
    }
    return std::vector<std::int64_t>{-1};
  };
  using S = std::vector<std::int64_t>;
  EXPECT_EQ(shape_of("model.layers.0.mlp.gate.weight"), (S{16, 512}));
  EXPECT_EQ(shape_of("model.layers.0.mlp.experts.15.gate_proj.weight"), (S{256, 512}));
  EXPECT_EQ(shape_of("model.layers.0.mlp.experts.15.down_proj.weight"), (S{512, 256}));
  EXPECT_EQ(shape_of("model.layers.3.mlp.shared_expert.up_proj.weight"), (S{512, 512}));
  EXPECT_EQ(shape_of("model.layers.3.mlp.shared_expert_gate.weight"), (S{1, 512}));
}

TEST(HfTensors, DeepSeekStyleMlaAndDenseFirstLayer) {
  const ModelSpec spec = model_preset("deepseek-tiny");
  ASSERT_TRUE(spec.is_mla());
  const auto metas = hf_tensors(spec);
  std::map<std::string, std::vector<std::int64_t>> shape;
  for (const auto& m : metas) shape[m.name] = m.shape;
  using S = std::vector<std::int64_t>;
  // heads 4, q_lora 128, kv_lora 64, nope 32, rope 16, v 32
  EXPECT_EQ(shape.at("model.layers.0.self_attn.q_a_proj.weight"), (S{128, 256}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.q_a_layernorm.weight"), (S{128}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.q_b_proj.weight"), (S{4 * 48, 128}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), (S{64 + 16, 256}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.kv_a_layernorm.weight"), (S{64}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.kv_b_proj.weight"), (S{4 * 64, 64}));
  EXPECT_EQ(shape.at("model.layers.0.self_attn.o_proj.weight"), (S{256, 4 * 32}));
  EXPECT_FALSE(shape.contains("model.layers.0.self_attn.q_proj.weight"));
  // first_k_dense_replace 1: layer 0 dense, layers 1 and 2 MoE with DeepSeek's shared experts.
  EXPECT_EQ(shape.at("model.layers.0.mlp.gate_proj.weight"), (S{512, 256}));
  EXPECT_FALSE(shape.contains("model.layers.0.mlp.gate.weight"));
  EXPECT_EQ(shape.at("model.layers.1.mlp.gate.weight"), (S{8, 256}));
  EXPECT_EQ(shape.at("model.layers.2.mlp.experts.7.up_proj.weight"), (S{128, 256}));
  EXPECT_EQ(shape.at("model.layers.2.mlp.shared_experts.down_proj.weight"), (S{256, 128}));
  EXPECT_FALSE(shape.contains("model.layers.2.mlp.shared_expert_gate.weight"));
  // The EAGLE draft stays dense.
  for (const auto& m : draft_tensors(spec)) EXPECT_EQ(m.name.find("experts"), std::string::npos);
}

TEST(ModelSpec, MoeAndMlaFromRealConfigs) {
  // Abridged from Qwen3-30B-A3B's config.json.
  const auto qwen = nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_size": 2048, "intermediate_size": 6144, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 151936})");
  const ModelSpec q = model_spec_from_json(qwen);
  EXPECT_EQ(q.num_experts, 128);
  EXPECT_EQ(q.moe_intermediate_size, 768);
  EXPECT_EQ(q.shared_expert_intermediate_size, 0);
  EXPECT_FALSE(q.is_mla());
  // Abridged from DeepSeek-V3's config.json.
  const auto deepseek = nlohmann::json::parse(R"({
    "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_attention_heads": 128, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "torch_dtype": "bfloat16", "vocab_size": 129280})");
  const ModelSpec d = model_spec_from_json(deepseek);
  EXPECT_EQ(d.num_experts, 256);
  EXPECT_EQ(d.shared_expert_intermediate_size, 2048);
  EXPECT_EQ(d.first_k_dense_replace, 3);
  EXPECT_EQ(d.kv_lora_rank, 512);
  EXPECT_TRUE(d.is_moe_layer(3));
  EXPECT_FALSE(d.is_moe_layer(2));
  EXPECT_EQ(model_spec_from_json(to_json(d)), d);
  // A dense model cannot carry expert sizes, and MLA needs all its dimensions.
  ModelSpec bad = model_preset("tiny");
  bad.moe_intermediate_size = 64;
  EXPECT_THROW(validate(bad), comm::ConfigError);
  ModelSpec half_mla = model_preset("tiny");
  half_mla.kv_lora_rank = 64;
  EXPECT_THROW(validate(half_mla), comm::ConfigError);
}

TEST(ModelSpec, JsonErrorsNameTheField) {
  const auto base = to_json(model_preset("tiny"));
  const auto expect_error = [&](nlohmann::json j, const std::string& field) {
    try {
      model_spec_from_json(j);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const comm::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  auto missing = base;
  missing.erase("hidden_size");
  expect_error(missing, "hidden_size");
  // One field of the valid config set to a wrong value each.
  const std::pair<std::string, nlohmann::json> wrong[] = {{"vocab_size", "1024"},
                                                          {"num_hidden_layers", 2.5},
                                                          {"intermediate_size", -1},
                                                          {"num_key_value_heads", 3},
                                                          {"torch_dtype", "float4"},
                                                          {"tie_word_embeddings", 1},
                                                          {"hidden_size", std::uint64_t{1} << 63}};
  for (const auto& [field, value] : wrong) {
    auto j = base;
    j[field] = value;
    expect_error(j, field);
  }
  expect_error(nlohmann::json::array(), "object");
}

TEST(FillTensor, DeterministicAndKeyedBySeedStepNameAndDtype) {
  const TensorMeta meta{"model.layers.0.mlp.up_proj.weight", DType::kBFloat16, {64, 48}};
  const Bytes a = generate(meta, 1, 0);
  EXPECT_EQ(generate(meta, 1, 0), a);
  EXPECT_NE(generate(meta, 2, 0), a);
  EXPECT_NE(generate(meta, 1, 1), a);
  TensorMeta renamed = meta;
  renamed.name = "model.layers.1.mlp.up_proj.weight";
  EXPECT_NE(generate(renamed, 1, 0), a);
  TensorMeta as_half = meta;
  as_half.dtype = DType::kFloat16;
  EXPECT_NE(generate(as_half, 1, 0), a);
  Bytes wrong(a.size() + 1);
  EXPECT_THROW(fill_tensor(meta, 1, 0, wrong), comm::EnforceError);
}

TEST(FillTensor, SizeOnlyTruncatesTheStream) {
  for (DType dtype : all_dtypes()) {
    const TensorMeta longer{"w", dtype, {67}};
    const Bytes full = generate(longer, 5, 3);
    for (std::int64_t n : {0, 1, 2, 3, 5, 7, 8, 9, 66}) {
      const Bytes part = generate(TensorMeta{"w", dtype, {n}}, 5, 3);
      ASSERT_TRUE(std::equal(part.begin(), part.end(), full.begin())) << to_string(dtype) << n;
    }
  }
}

// Exponent field bits of each floating dtype: a value is finite iff they are not all ones
// (float8_e4m3fn has no infinity; its only NaN is all-ones exponent and mantissa).
struct FloatFormat {
  DType dtype;
  int exponent_bits;
  int mantissa_bits;
  int bias;
  double lo, hi;  // documented magnitude range
};

TEST(FillTensor, FloatsAreFiniteNormalAndSmall) {
  const std::vector<FloatFormat> formats = {
      {DType::kBFloat16, 8, 7, 127, 0x1p-8, 1.0},  {DType::kFloat16, 5, 10, 15, 0x1p-8, 1.0},
      {DType::kFloat32, 8, 23, 127, 0x1p-8, 1.0},  {DType::kFloat64, 11, 52, 1023, 0x1p-8, 1.0},
      {DType::kFloat8E5M2, 5, 2, 15, 0x1p-8, 1.0}, {DType::kFloat8E4M3Fn, 4, 3, 7, 0x1p-6, 4.0}};
  for (const auto& f : formats) {
    const TensorMeta meta{"w", f.dtype, {4096}};
    const Bytes bytes = generate(meta, 7, 2);
    const std::size_t width = element_size(f.dtype);
    int negative = 0;
    for (std::size_t i = 0; i < 4096; ++i) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &bytes[i * width], width);
      const std::uint64_t exponent = (bits >> f.mantissa_bits) & ((1ull << f.exponent_bits) - 1);
      const std::uint64_t mantissa = bits & ((1ull << f.mantissa_bits) - 1);
      ASSERT_GT(exponent, 0u) << to_string(f.dtype) << " subnormal or zero";
      ASSERT_LT(exponent, (1ull << f.exponent_bits) - 1) << to_string(f.dtype) << " inf/NaN";
      const double magnitude =
          std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -f.mantissa_bits),
                     static_cast<int>(exponent) - f.bias);
      ASSERT_GE(magnitude, f.lo) << to_string(f.dtype);
      ASSERT_LT(magnitude, f.hi) << to_string(f.dtype);
      negative += static_cast<int>((bits >> (8 * width - 1)) & 1);
    }
    EXPECT_GT(negative, 1700) << to_string(f.dtype);
    EXPECT_LT(negative, 2400) << to_string(f.dtype);
  }
  const Bytes flags = generate(TensorMeta{"mask", DType::kBool, {1000}}, 1, 0);
  int ones = 0;
  for (std::byte b : flags) {
    ASSERT_LE(std::to_integer<int>(b), 1);
    ones += std::to_integer<int>(b);
  }
  EXPECT_GT(ones, 400);
  EXPECT_LT(ones, 600);
}

TEST(FillTensor, TinyModelDigestIsStableAcrossVersionsAndMachines) {
  // Computed once with this library and checked in: trainer and engine builds must agree.
  std::vector<NamedDigest> digests;
  for (const auto& m : hf_tensors(model_preset("tiny"))) {
    digests.push_back({m.name, tensor_digest(generate(m, 0, 0))});
  }
  EXPECT_EQ(to_string(combined_digest(digests)), "a0d2167e323e9d1abd3e05cb91c11531");
  EXPECT_EQ(to_string(tensor_digest(generate(TensorMeta{"x", DType::kFloat32, {5}}, 42, 7))),
            "9bb5a561442b3d7d29b2f62a970cc9e5");
}

float f32_at(const Bytes& b, std::size_t i) {
  float v;
  std::memcpy(&v, b.data() + i * 4, 4);
  return v;
}

TEST(FillTensor, StepsDriftByLessThanASixteenthOfEachValue) {
  const TensorMeta m{"model.layers.0.mlp.up_proj.weight", DType::kFloat32, {64, 64}};
  const Bytes s0 = generate(m, 3, 0), s1 = generate(m, 3, 1), s9 = generate(m, 3, 9);
  std::size_t changed = 0;
  for (std::size_t i = 0; i < 64 * 64; ++i) {
    for (const Bytes* other : {&s1, &s9}) {
      const float a = f32_at(s0, i), b = f32_at(*other, i);
      ASSERT_LT(std::fabs(a - b), std::fabs(a) / 16) << "element " << i;
      ASSERT_EQ(std::signbit(a), std::signbit(b));
    }
    changed += f32_at(s0, i) != f32_at(s1, i);
  }
  EXPECT_GT(changed, 64u * 64u * 99 / 100) << "almost every element moves between steps";
}

TEST(FillTensor, FrozenEagleFcIsANearIdentity) {
  const ModelSpec spec = model_preset("tiny");
  const std::int64_t h = spec.hidden_size;
  const TensorMeta m{"draft.fc.weight", DType::kFloat32, {h, 2 * h}};
  const Bytes w = generate(m, 0, 0);
  for (std::int64_t r = 0; r < h; ++r) {
    for (std::int64_t c = 0; c < 2 * h; ++c) {
      const float v = f32_at(w, static_cast<std::size_t>(r * 2 * h + c));
      if (r == c) {
        ASSERT_EQ(v, 1.0f);
      } else {
        ASSERT_LT(std::fabs(v), 1.0f / 64) << r << "," << c;
        ASSERT_GT(std::fabs(v), 0.0f);
      }
    }
  }
}

TEST(FillTensor, ModelMatricesAreChangedByASecondShuffle) {
  for (const auto& m : hf_tensors(model_preset("tiny"))) {
    Bytes once = generate(m, 0, 0);
    apply_layout(Layout::kShuffle, m, once);
    Bytes twice = once;
    apply_layout(Layout::kShuffle, m, twice);
    EXPECT_EQ(shuffle_moves(m.shape, 2), m.shape.size() == 2) << m.name;
    if (m.shape.size() == 2) {
      EXPECT_NE(twice, once) << m.name;
    }
  }
}

// Not an assertion on speed: the number goes to the log for the docs.
TEST(FillTensor, LogsThroughput) {
  const TensorMeta meta{"model.layers.0.mlp.up_proj.weight", DType::kBFloat16, {8192, 4096}};
  Bytes out(meta.byte_count());
  const auto start = std::chrono::steady_clock::now();
  fill_tensor(meta, 1, 1, out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Bytes first_row = generate(TensorMeta{meta.name, meta.dtype, {1, 4096}}, 1, 1);
  EXPECT_TRUE(std::equal(first_row.begin(), first_row.end(), out.begin()));
  std::printf("fill_tensor: %.2f GB/s on a [8192, 4096] bf16 tensor\n",
              static_cast<double>(out.size()) / seconds / 1e9);
}

}  // namespace
}  // namespace weightcast::sync
