// NameFilter: the one glob matcher the engine (which tensors a runner loads) and the trainer's
// verification (which tensors a runner should hold) share.
#include "sync/model/name_filter.h"

#include <fnmatch.h>

#include <string>

#include <gtest/gtest.h>

#include "comm/errors.h"

namespace weightcast::sync {
namespace {

TEST(NameFilter, MatchesAnyGlobAcrossDots) {
  auto f = NameFilter::parse("model.*,lm_head.weight");
  EXPECT_TRUE(f.accepts("model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE(f.accepts("lm_head.weight"));
  EXPECT_FALSE(f.accepts("lm_head.bias"));
  EXPECT_FALSE(f.accepts("mtp.fc.weight"));
  EXPECT_EQ(f.text(), "model.*,lm_head.weight");
}

TEST(NameFilter, EmptyAcceptsNothingAndBadGlobsAreRefused) {
  EXPECT_FALSE(NameFilter::parse("").accepts("anything"));
  EXPECT_FALSE(NameFilter::parse(",,").accepts("x"));
  EXPECT_TRUE(NameFilter::parse("*").accepts("x"));
  EXPECT_THROW(NameFilter::parse("model.* ,x"), comm::BadRequestError);
}

TEST(NameFilter, FromGlobsDecidesAsParse) {
  // What /server_info reports (the globs, split) must filter exactly as the engine's own flag.
  const auto parsed = NameFilter::parse("x,lm_head.*,model.*");
  const auto split = NameFilter::from_globs(parsed.globs());
  EXPECT_EQ(split.globs(), parsed.globs());
  for (const char* name : {"model.layers.0.mlp.up_proj.weight", "lm_head.weight", "x",
                           "mtp.fc.weight", "xx", "model"}) {
    EXPECT_EQ(split.accepts(name), parsed.accepts(name)) << name;
  }
  EXPECT_TRUE(split.accepts("lm_head.weight"));
  EXPECT_FALSE(NameFilter::from_globs({}).accepts("model.norm.weight"));
  EXPECT_FALSE(NameFilter::from_globs({"draft.*"}).accepts("model.norm.weight"));
  EXPECT_THROW(NameFilter::from_globs({"model.*", "bad glob"}), comm::BadRequestError);
}

TEST(NameFilter, LiteralAndPrefixGlobsDecideAsFnmatch) {
  // Literal globs and "prefix*" are matched without fnmatch; every glob must still decide as
  // fnmatch(glob, name, 0) does, the rule the docs give.
  const char* globs[] = {
      "model.*",     "lm_head.weight", "*",    "model.layers.1*", "model.?ayers.*",
      "model.[lm]*", "mtp.*.weight",   "a\\*", "model.",          "*.weight"};
  const char* names[] = {"model.layers.0.mlp.up_proj.weight",
                         "model.",
                         "model",
                         "lm_head.weight",
                         "lm_head.weight2",
                         "model.layers.10.x",
                         "mtp.fc.weight",
                         "a*",
                         "ab",
                         "x.weight",
                         "model.norm.weight"};
  for (const char* glob : globs) {
    const auto f = NameFilter::parse(glob);
    for (const char* name : names) {
      EXPECT_EQ(f.accepts(name), fnmatch(glob, name, 0) == 0) << glob << " vs " << name;
    }
  }
}

}  // namespace
}  // namespace weightcast::sync
