// Comparison semantics: ULP distances, stage order, bounds and bitwise criteria.
#include "mok/verify/compare.hpp"

#include <gtest/gtest.h>

namespace {

using namespace mok;

TEST(UlpDistance, NeighboursAndSigns) {
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x3F80, 0x3F81), 1u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x0000, 0x8000), 0u);  // +0 and -0 are 0 ulps apart
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x0001, 0x8001), 2u);  // across zero
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF32, 0x3F800000, 0x3F800003), 3u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF32, 0x7FC00000, 0x3F800000), UINT64_MAX);
}

TEST(StageOrder, ForwardBeforeBackward) {
  EXPECT_LT(verify::stage_rank("intermediates/gate"), verify::stage_rank("intermediates/y"));
  EXPECT_LT(verify::stage_rank("intermediates/y"), verify::stage_rank("outputs/output"));
  EXPECT_LT(verify::stage_rank("outputs/output"), verify::stage_rank("grads/d_x"));
}

}  // namespace
