// sync/model/lora.h: PEFT names and config, and the adapter checks an engine runs before staging.
#include "sync/model/lora.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

const std::map<std::string, std::vector<std::int64_t>> kBase{
    {"model.layers.0.self_attn.q_proj.weight", {64, 32}},
    {"model.layers.0.self_attn.v_proj.weight", {16, 32}},
    {"model.layers.0.mlp.down_proj.weight", {32, 96}},
};

LoraConfig config(int r = 4) {
  return parse_lora_config(R"({"r": )" + std::to_string(r) +
                           R"(, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
                               "lora_dropout": 0.0})");
}

std::vector<TensorMeta> adapter(int r = 4) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  const std::string v = "model.layers.0.self_attn.v_proj";
  return {{lora_tensor_name(q, LoraPart::kA), DType::kBFloat16, {r, 32}},
          {lora_tensor_name(q, LoraPart::kB), DType::kBFloat16, {64, r}},
          {lora_tensor_name(v, LoraPart::kA), DType::kBFloat16, {r, 32}},
          {lora_tensor_name(v, LoraPart::kB), DType::kBFloat16, {16, r}}};
}

void expect_refused(const std::vector<TensorMeta>& tensors, const std::string& needle,
                    const LoraConfig& c = config()) {
  try {
    check_adapter(c, tensors, kBase);
    FAIL() << "accepted; expected a refusal naming " << needle;
  } catch (const comm::BadRequestError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LoraConfigTest, ParsesPeftConfigAndKeepsTheOtherKeys) {
  const LoraConfig c = config(16);
  EXPECT_EQ(c.r, 16);
  EXPECT_DOUBLE_EQ(c.scaling(), 0.5);
  EXPECT_TRUE(c.targets("model.layers.3.self_attn.q_proj"));
  EXPECT_FALSE(c.targets("model.layers.3.self_attn.k_proj"));
  const LoraConfig back = parse_lora_config(to_json_string(c));
  EXPECT_EQ(back.target_modules, c.target_modules);
  EXPECT_EQ(back.extra_json, R"({"lora_dropout":0.0})");
}

TEST(LoraConfigTest, BadConfigsNameTheField) {
  for (const auto& [json, field] : std::vector<std::pair<std::string, std::string>>{
           {"[]", "config"},
           {R"({"lora_alpha": 8, "target_modules": ["q_proj"]})", "config.r"},
           {R"({"r": 0, "lora_alpha": 8, "target_modules": ["q_proj"]})", "config.r"},
           {R"({"r": 4, "lora_alpha": -1, "target_modules": ["q_proj"]})", "config.lora_alpha"},
           {R"({"r": 4, "lora_alpha": 8, "target_modules": []})", "config.target_modules"},
           {R"({"r": 4, "lora_alpha": 8, "target_modules": ["a.q_proj"]})",
            "config.target_modules"},
       }) {
    try {
      parse_lora_config(json);
      ADD_FAILURE() << json << " was accepted";
    } catch (const comm::BadRequestError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

TEST(LoraNames, PeftNamesRoundTripAndOthersAreNotLora) {
  const auto a =
      parse_lora_tensor_name("base_model.model.model.layers.1.mlp.up_proj.lora_A.weight");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->module, "model.layers.1.mlp.up_proj");
  EXPECT_EQ(a->part, LoraPart::kA);
  EXPECT_EQ(lora_tensor_name(a->module, LoraPart::kA),
            "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight");
  EXPECT_EQ(parse_lora_tensor_name("model.layers.1.mlp.up_proj.lora_B.weight")->part, LoraPart::kB);
  EXPECT_FALSE(parse_lora_tensor_name("model.layers.1.mlp.up_proj.weight").has_value());
  EXPECT_FALSE(parse_lora_tensor_name(".lora_A.weight").has_value());
  EXPECT_NO_THROW(validate_adapter_name("math-v2.1_r16"));
  EXPECT_THROW(validate_adapter_name(""), comm::BadRequestError);
  EXPECT_THROW(validate_adapter_name("a/b"), comm::BadRequestError);
}

TEST(LoraAdapterCheck, AcceptsAWellFormedAdapter) {
  EXPECT_NO_THROW(check_adapter(config(), adapter(), kBase));
}

TEST(LoraAdapterCheck, RefusalsNameTheTensor) {
  auto wrong_rank = adapter();
  wrong_rank[0].shape = {8, 32};
  expect_refused(wrong_rank, "q_proj.lora_A.weight': shape [8, 32], expected [4, 32]");
  auto missing = adapter();
  missing.pop_back();
  expect_refused(missing, "v_proj.lora_B.weight' is missing");
  auto untargeted = adapter();
  untargeted.push_back(
      {lora_tensor_name("model.layers.0.mlp.down_proj", LoraPart::kA), DType::kBFloat16, {4, 96}});
  expect_refused(untargeted, "'down_proj' is not in config.target_modules");
  auto twice = adapter();
  twice.push_back(twice[0]);
  expect_refused(twice, "appears twice");
  auto no_base = adapter();
  no_base[0].name = lora_tensor_name("model.layers.9.self_attn.q_proj", LoraPart::kA);
  expect_refused(no_base, "no 2-D weight 'model.layers.9.self_attn.q_proj.weight'");
  expect_refused({{"model.layers.0.self_attn.q_proj.weight", DType::kBFloat16, {64, 32}}},
                 "not a LoRA tensor");
  expect_refused({}, "holds no tensor");
}

}  // namespace
}  // namespace weightcast::sync
