// Shard classes and the slices a class's send carries (sync/trainer/shard_classes.h).
#include "sync/trainer/shard_classes.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/trainer/engine_checks.h"

namespace weightcast::sync::trainer {
namespace {

ShardPlan plan(std::int64_t offset) {
  ShardPlan p;
  p.tensors["w"] = TensorSlice::slice(0, offset, 2);
  p.tensors["norm"] = TensorSlice::replicated();
  p.tensors["expert"] = offset == 0 ? TensorSlice::replicated() : TensorSlice::absent();
  return p;
}

TEST(ShardClasses, RanksOfEqualPlansShareAClassAcrossEngines) {
  // Engine 0: two ranks with plans; engine 1: none (4 ranks); engine 2: the same two plans.
  const std::vector<std::vector<ShardPlan>> plans = {{plan(0), plan(2)}, {}, {plan(0), plan(2)}};
  const std::vector<int> counts = {2, 4, 2};
  const std::vector<std::size_t> members = {0, 1, 2};
  const auto classes = shard_classes(members, plans, counts);
  ASSERT_EQ(classes.size(), 3u);
  EXPECT_TRUE(classes[0].full);
  EXPECT_EQ(classes[0].members, (std::vector<ShardClass::Member>{{1, {0, 1, 2, 3}}}));
  EXPECT_EQ(classes[1].key, plan(0).class_key());
  EXPECT_EQ(classes[1].members, (std::vector<ShardClass::Member>{{0, {0}}, {2, {0}}}));
  EXPECT_EQ(classes[2].members, (std::vector<ShardClass::Member>{{0, {1}}, {2, {1}}}));
  // Only the members count: without engine 1 there is no full class.
  const std::vector<std::size_t> some = {0};
  EXPECT_EQ(shard_classes(some, plans, counts).size(), 2u);
  EXPECT_THROW(shard_classes(members, plans, std::vector<int>{3, 4, 2}), comm::EnforceError);
}

TEST(ShardClasses, ASliceSourceViewsSlicesInPlaceAndBorrowsTheRest) {
  std::vector<float> w(4 * 3), norm(3), expert(5);
  std::iota(w.begin(), w.end(), 0.0f);
  std::iota(norm.begin(), norm.end(), 100.0f);
  const auto bytes = [](const std::vector<float>& v) { return std::as_bytes(std::span(v)); };
  const std::vector<NamedTensor> full = {
      {{"w", DType::kFloat32, {4, 3}}, bytes(w)},
      {{"norm", DType::kFloat32, {3}}, bytes(norm)},
      {{"expert", DType::kFloat32, {5}}, bytes(expert)},
  };
  std::vector<std::string> awaited;
  ShardClass cls{"k", false, plan(2), {}};
  SliceSource source;
  auto part = source.reset(
      cls, full, [&](const std::string& n, comm::Deadline) { awaited.push_back(n); }, false);
  ASSERT_EQ(part.size(), 2u);  // the absent expert is left out
  EXPECT_EQ(part[0].meta.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_TRUE(part[0].bytes.empty());  // a view of w: no copy kept
  ASSERT_NE(part[0].view, nullptr);
  EXPECT_EQ(part[0].view->full.data(), full[0].bytes.data());
  EXPECT_EQ(part[1].bytes.data(), full[1].bytes.data());  // replicated: borrowed
  EXPECT_EQ(source.bytes(), 6 * 4 + 3 * 4u);
  source.await("w", comm::deadline_after(comm::Millis(1000)));
  EXPECT_EQ(awaited, (std::vector<std::string>{"w"}));  // the stage's own wait
  EXPECT_EQ(tensor_size(part[0]), 6 * 4u);
  std::vector<float> got(6);
  write_tensor(part[0], std::as_writable_bytes(std::span(got)));
  EXPECT_EQ(got, (std::vector<float>{6, 7, 8, 9, 10, 11}));  // rows 2 and 3
  // Its digest, read run by run, is the packed bytes' (a column slice: one run per row).
  EXPECT_EQ(digest_of(part[0]), tensor_digest(std::as_bytes(std::span(got))));
  const NamedTensor column{
      {"w", DType::kFloat32, {4, 1}}, {}, nullptr, nullptr};  // the shape a dim-1 slice has
  const SliceView cols{full[0].meta, TensorSlice::slice(1, 1, 1), full[0].bytes};
  NamedTensor col = column;
  col.view = &cols;
  std::vector<float> c(4);
  write_tensor(col, std::as_writable_bytes(std::span(c)));
  EXPECT_EQ(c, (std::vector<float>{1, 4, 7, 10}));
  EXPECT_EQ(digest_of(col), tensor_digest(std::as_bytes(std::span(c))));
  // Whole (an adapter session): every tensor as it is.
  part = source.reset(cls, full, nullptr, true);
  ASSERT_EQ(part.size(), 3u);
  EXPECT_EQ(part[0].bytes.data(), full[0].bytes.data());
  // The full class takes everything whole too.
  part = source.reset(ShardClass{"full", true, {}, {}}, full, nullptr, false);
  EXPECT_EQ(part.size(), 3u);
  // A tensor the plan does not name goes whole.
  cls.plan.tensors.erase("norm");
  part = source.reset(cls, full, nullptr, false);
  ASSERT_EQ(part.size(), 2u);
  EXPECT_EQ(part[1].bytes.data(), full[1].bytes.data());
}

// At begin: a tensor no rank's plan names goes whole to every rank; one that only some ranks'
// plans name is a hole, refused naming the engine and the tensor.
TEST(ShardClasses, PlansAreCheckedAgainstTheTensorsSent) {
  // Announced: a tensor every rank says absent is left out of them all (so it goes whole).
  ServerInfoResponse info;
  for (std::int64_t offset : {0, 2}) {
    ShardPlan p = plan(offset);
    p.tensors["skipped"] = TensorSlice::absent();
    info.shard_plans.push_back(to_json(p).dump());
  }
  const auto announced = announced_shard_plans("http://e", info);
  ASSERT_EQ(announced.size(), 2u);
  EXPECT_EQ(announced[0].find("skipped"), nullptr);
  EXPECT_EQ(announced[1].find("expert")->kind, TensorSlice::Kind::kAbsent);  // rank 0 keeps it
  const std::vector<TensorMeta> tensors = {{"w", DType::kFloat32, {4, 3}},
                                           {"norm", DType::kFloat32, {3}},
                                           {"expert", DType::kFloat32, {5}},
                                           {"q_norm", DType::kFloat32, {3}}};
  std::vector<ShardPlan> plans = {plan(0), plan(2)};
  EXPECT_NO_THROW(check_shard_plans("http://e", plans, tensors));
  plans[1].tensors.erase("norm");
  try {
    check_shard_plans("http://e", plans, tensors);
    FAIL() << "a plan with a hole was accepted";
  } catch (const comm::BadRequestError& e) {
    EXPECT_NE(std::string(e.what()).find("engine http://e: shard plan refused"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("norm"), std::string::npos) << e.what();
  }
}

TEST(ShardClasses, ModeNames) {
  EXPECT_EQ(parse_shard_mode("auto"), ShardMode::kAuto);
  EXPECT_EQ(to_string(parse_shard_mode("off")), "off");
  EXPECT_THROW(parse_shard_mode("on"), comm::ConfigError);
}

}  // namespace
}  // namespace weightcast::sync::trainer
