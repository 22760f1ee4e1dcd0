// Tests of the schema v1 table, dim naming, locate(), and the Tensor/TensorMap basics.
#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"
#include "mok/reference/tensor.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <set>
#include <sstream>
#include <string>

namespace mok::ref {
namespace {

spec::LayerConfig small_config() {
  spec::LayerConfig cfg;
  cfg.hidden = 64;
  cfg.intermediate = 32;
  cfg.shared_intermediate = 16;
  cfg.num_experts = 32;
  cfg.top_k = 4;
  cfg.num_ranks = 2;
  cfg.tokens_per_rank = 8;
  return cfg;
}

std::string dims_of(const TensorSpec& spec) {
  std::string s;
  for (Dim d : spec.dims) s += std::string(s.empty() ? "" : ",") + dim_symbol(d);
  return s;
}

TEST(Schema, HasEveryDatasetOnceWithItsDtypeAndDims) {
  // path -> (dtype, dims, needs_shared), exactly schema v1.
  struct Row {
    const char* path;
    DType dtype;
    const char* dims;
    bool shared;
  };
  const std::vector<Row> expected = {
      {"inputs/x", DType::kBf16, "G,H", false},
      {"inputs/topk_experts", DType::kI32, "G,K", false},
      {"inputs/router_weights", DType::kF32, "G,K", false},
      {"inputs/w_shared_gate", DType::kBf16, "Is,H", true},
      {"inputs/w_shared_up", DType::kBf16, "Is,H", true},
      {"inputs/w_shared_down", DType::kBf16, "H,Is", true},
      {"inputs/w_routed_gate", DType::kBf16, "E,I,H", false},
      {"inputs/w_routed_up", DType::kBf16, "E,I,H", false},
      {"inputs/w_routed_down", DType::kBf16, "E,H,I", false},
      {"inputs/d_output", DType::kBf16, "G,H", false},
      {"outputs/output", DType::kBf16, "G,H", false},
      {"grads/d_x", DType::kBf16, "G,H", false},
      {"grads/d_router_weights", DType::kF32, "G,K", false},
      {"grads/d_w_routed_gate", DType::kF32, "E,I,H", false},
      {"grads/d_w_routed_up", DType::kF32, "E,I,H", false},
      {"grads/d_w_routed_down", DType::kF32, "E,H,I", false},
      {"grads/d_w_shared_gate", DType::kF32, "R,Is,H", true},
      {"grads/d_w_shared_up", DType::kF32, "R,Is,H", true},
      {"grads/d_w_shared_down", DType::kF32, "R,H,Is", true},
      {"intermediates/gate", DType::kF32, "G,K,I", false},
      {"intermediates/up", DType::kF32, "G,K,I", false},
      {"intermediates/act", DType::kBf16, "G,K,I", false},
      {"intermediates/y", DType::kBf16, "G,K,H", false},
      {"intermediates/shared_gate", DType::kF32, "G,Is", true},
      {"intermediates/shared_up", DType::kF32, "G,Is", true},
      {"intermediates/shared_act", DType::kBf16, "G,Is", true},
      {"intermediates/shared_out", DType::kF32, "G,H", true},
      {"intermediates/dy", DType::kBf16, "G,K,H", false},
      {"intermediates/d_act", DType::kF32, "G,K,I", false},
      {"intermediates/d_gate", DType::kBf16, "G,K,I", false},
      {"intermediates/d_up", DType::kBf16, "G,K,I", false},
      {"intermediates/dx_slot", DType::kBf16, "G,K,H", false},
      {"intermediates/shared_d_act", DType::kF32, "G,Is", true},
      {"intermediates/shared_d_gate", DType::kBf16, "G,Is", true},
      {"intermediates/shared_d_up", DType::kBf16, "G,Is", true},
      {"intermediates/dx_shared", DType::kF32, "G,H", true},
  };
  const int num_checked = 9;  // output + 8 grads: exact, radius, terms, and the end-to-end exact and radius
  EXPECT_EQ(golden_schema().size(), expected.size() + 5 * num_checked);
  for (const Row& row : expected) {
    const TensorSpec* spec = find_spec(row.path);
    ASSERT_NE(spec, nullptr) << row.path;
    EXPECT_EQ(spec->dtype, row.dtype) << row.path;
    EXPECT_EQ(dims_of(*spec), row.dims) << row.path;
    EXPECT_EQ(spec->needs_shared, row.shared) << row.path;
    EXPECT_NE(std::string(spec->what), "") << row.path;
  }
  std::set<std::string> paths;
  for (const TensorSpec& spec : golden_schema()) {
    EXPECT_TRUE(paths.insert(spec.path).second) << "duplicate " << spec.path;
  }
}

TEST(Schema, EveryCheckedTensorHasExactAndRadiusBounds) {
  int num_checked = 0;
  for (const TensorSpec& spec : golden_schema()) {
    if (spec.role != Role::kOutput && spec.role != Role::kGrad) continue;
    ++num_checked;
    const std::pair<std::string, Role> bounds[] = {{bound_exact_path(spec.path), Role::kBoundExact},
                                                   {bound_radius_path(spec.path), Role::kBoundRadius},
                                                   {bound_terms_path(spec.path), Role::kBoundTerms},
                                                   {end_to_end_exact_path(spec.path), Role::kEndToEndExact},
                                                   {end_to_end_radius_path(spec.path), Role::kEndToEndRadius}};
    std::vector<const TensorSpec*> found;
    for (const auto& [path, role] : bounds) {
      const TensorSpec* b = find_spec(path);
      ASSERT_NE(b, nullptr) << path;
      EXPECT_EQ(b->role, role) << path;
      found.push_back(b);
    }
    for (const TensorSpec* b : found) {
      EXPECT_TRUE(is_bound_role(b->role)) << b->path;
      EXPECT_EQ(checked_path_of_bound(b->path), spec.path) << b->path;
      EXPECT_EQ(b->dtype, DType::kF32) << b->path;
      EXPECT_EQ(b->dims, spec.dims) << b->path;
      EXPECT_EQ(b->needs_shared, spec.needs_shared) << b->path;
    }
  }
  EXPECT_EQ(num_checked, 9);
  EXPECT_EQ(bound_exact_path("outputs/output"), "bounds/output_exact");
  EXPECT_EQ(bound_radius_path("grads/d_x"), "bounds/d_x_bound");
  EXPECT_NE(find_spec("bounds/d_w_shared_down_bound"), nullptr);
  EXPECT_EQ(end_to_end_exact_path("outputs/output"), "bounds/output_e2e_exact");
  EXPECT_EQ(end_to_end_radius_path("grads/d_x"), "bounds/d_x_e2e_bound");
  EXPECT_EQ(bound_terms_path("grads/d_router_weights"), "bounds/d_router_weights_terms");
  EXPECT_FALSE(is_bound_role(Role::kGrad));
  EXPECT_THROW(checked_path_of_bound("grads/d_x"), mok::Error);
  EXPECT_THROW(checked_path_of_bound("bounds/nope_bound"), mok::Error);
}

TEST(Schema, UnknownPathIsNull) {
  EXPECT_EQ(find_spec("inputs/nope"), nullptr);
  EXPECT_EQ(find_spec("x"), nullptr);
  EXPECT_EQ(find_spec(""), nullptr);
}

TEST(Schema, DimNamesAndSizes) {
  const spec::LayerConfig cfg = small_config();
  const std::vector<std::tuple<Dim, const char*, const char*, int64_t>> rows = {
      {Dim::kTokens, "G", "token", 16},   {Dim::kSlots, "K", "slot", 4},
      {Dim::kExperts, "E", "expert", 32}, {Dim::kRanks, "R", "rank", 2},
      {Dim::kHidden, "H", "h", 64},       {Dim::kInter, "I", "i", 32},
      {Dim::kSharedInter, "Is", "is", 16}};
  for (const auto& [dim, symbol, axis, size] : rows) {
    EXPECT_STREQ(dim_symbol(dim), symbol);
    EXPECT_STREQ(dim_axis_name(dim), axis);
    EXPECT_EQ(dim_size(dim, cfg), size) << symbol;
  }
}

TEST(Schema, ShapesAndSharedApplicability) {
  spec::LayerConfig cfg = small_config();
  EXPECT_EQ(spec_shape(*find_spec("inputs/w_routed_down"), cfg),
            (std::vector<int64_t>{32, 64, 32}));
  EXPECT_EQ(spec_shape(*find_spec("grads/d_w_shared_gate"), cfg),
            (std::vector<int64_t>{2, 16, 64}));
  EXPECT_EQ(spec_shape(*find_spec("intermediates/y"), cfg), (std::vector<int64_t>{16, 4, 64}));
  EXPECT_TRUE(spec_applies(*find_spec("inputs/w_shared_gate"), cfg));
  cfg.shared_intermediate = 0;
  EXPECT_FALSE(spec_applies(*find_spec("inputs/w_shared_gate"), cfg));
  EXPECT_FALSE(spec_applies(*find_spec("bounds/d_w_shared_up_exact"), cfg));
  EXPECT_TRUE(spec_applies(*find_spec("inputs/x"), cfg));
}

TEST(Schema, FormatConfigNamesEveryField) {
  EXPECT_EQ(format_config(small_config()), "H=64 I=32 Is=16 E=32 K=4 R=2 T=8");
}

// spec_bytes: the shape's elements times the dtype's size, in a double that the largest layers
// validate() accepts do not overflow (E = 2^20 experts of 2^24 x 2^24: 2^69 bytes of bf16).
TEST(Schema, BytesOfADataset) {
  spec::LayerConfig cfg = small_config();
  EXPECT_EQ(spec_bytes(*find_spec("inputs/w_routed_down"), cfg), 32.0 * 64 * 32 * 2);
  EXPECT_EQ(spec_bytes(*find_spec("inputs/router_weights"), cfg), 16.0 * 4 * 4);
  EXPECT_EQ(spec_bytes(*find_spec("bounds/d_w_shared_gate_exact"), cfg), 2.0 * 16 * 64 * 4);
  cfg.shared_intermediate = 0;
  EXPECT_EQ(spec_bytes(*find_spec("inputs/w_shared_gate"), cfg), 0.0);
  cfg.hidden = cfg.intermediate = int64_t{1} << 24;
  cfg.num_experts = int64_t{1} << 20;
  ASSERT_TRUE(cfg.validate().ok) << cfg.validate().message;
  EXPECT_EQ(spec_bytes(*find_spec("inputs/w_routed_gate"), cfg), 0x1.0p69);
}

TEST(Schema, LocateNamesCoordinates) {
  spec::LayerConfig cfg = small_config();
  cfg.num_experts = 64;
  cfg.tokens_per_rank = 4;  // G = 8
  Tensor topk(DType::kI32, {8, 4});
  topk.data<int32_t>()[5 * 4 + 2] = 17;
  const int64_t K = 4, H = 64, I = 32, Is = 16;
  EXPECT_EQ(locate(*find_spec("intermediates/y"), cfg, (5 * K + 2) * H + 40, &topk),
            "token=5 slot=2 expert=17 h=40");
  EXPECT_EQ(locate(*find_spec("intermediates/y"), cfg, (5 * K + 2) * H + 40),
            "token=5 slot=2 h=40");
  EXPECT_EQ(locate(*find_spec("inputs/w_routed_gate"), cfg, (3 * I + 7) * H + 40, &topk),
            "expert=3 i=7 h=40");
  EXPECT_EQ(locate(*find_spec("grads/d_w_shared_gate"), cfg, (1 * Is + 3) * H + 9),
            "rank=1 is=3 h=9");
  EXPECT_EQ(locate(*find_spec("outputs/output"), cfg, 5 * H + 40, &topk), "token=5 h=40");
  EXPECT_EQ(locate(*find_spec("inputs/router_weights"), cfg, 5 * K + 2, &topk),
            "token=5 slot=2 expert=17");
  // A routing tensor of the wrong shape is ignored rather than read out of bounds.
  Tensor wrong(DType::kI32, {2, 2});
  EXPECT_EQ(locate(*find_spec("intermediates/y"), cfg, 0, &wrong), "token=0 slot=0 h=0");
  EXPECT_NE(locate(*find_spec("outputs/output"), cfg, 8 * H).find("outside"), std::string::npos);
}

// Parsing locate()'s coordinates back gives the flat index, for every spec and random configs.
RC_GTEST_PROP(Schema, LocateInvertsFlatIndex, ()) {
  spec::LayerConfig cfg;
  cfg.hidden = 16 * *rc::gen::inRange<int64_t>(1, 5);
  cfg.intermediate = 16 * *rc::gen::inRange<int64_t>(1, 5);
  cfg.shared_intermediate = 16 * *rc::gen::inRange<int64_t>(1, 3);
  cfg.num_ranks = *rc::gen::inRange<int64_t>(1, 5);
  cfg.num_experts = cfg.num_ranks * *rc::gen::inRange<int64_t>(1, 4);
  cfg.top_k = *rc::gen::inRange<int64_t>(1, cfg.num_experts + 1);
  cfg.tokens_per_rank = *rc::gen::inRange<int64_t>(1, 6);
  RC_ASSERT(cfg.validate().ok);
  const auto& schema = golden_schema();
  const TensorSpec& spec = schema[*rc::gen::inRange<size_t>(0, schema.size())];
  const std::vector<int64_t> shape = spec_shape(spec, cfg);
  int64_t numel = 1;
  for (int64_t n : shape) numel *= n;
  const int64_t flat = *rc::gen::inRange<int64_t>(0, numel);

  std::istringstream in(locate(spec, cfg, flat));
  int64_t rebuilt = 0;
  for (size_t a = 0; a < spec.dims.size(); ++a) {
    std::string item;
    RC_ASSERT(static_cast<bool>(in >> item));
    const std::string prefix = std::string(dim_axis_name(spec.dims[a])) + "=";
    RC_ASSERT(item.rfind(prefix, 0) == 0);
    const int64_t coord = std::stoll(item.substr(prefix.size()));
    RC_ASSERT(coord >= 0 && coord < shape[a]);
    rebuilt = rebuilt * shape[a] + coord;
  }
  RC_ASSERT(rebuilt == flat);
}

TEST(Tensor, AllocatesZeroFilledAlignedStorage) {
  Tensor t(DType::kBf16, {3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.size_bytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 8, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.bits_at(i), 0u);
  EXPECT_EQ(t.shape_string(), "[3, 5]");
  EXPECT_EQ(Tensor(DType::kF32, {128, 64}).shape_string(), "[128, 64]");
}

TEST(Tensor, ZeroDimMeansNoElementsAndNegativeDimThrows) {
  EXPECT_EQ(Tensor(DType::kF32, {4, 0, 3}).numel(), 0);
  EXPECT_EQ(Tensor(DType::kF32, {4, 0, 3}).size_bytes(), 0u);
  EXPECT_EQ(Tensor(DType::kF32, {}).numel(), 1);  // a scalar
  EXPECT_THROW(Tensor(DType::kF32, {2, -1}), mok::Error);
  EXPECT_THROW(Tensor(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}), mok::Error);
}

TEST(Tensor, DtypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::kBf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::kF32), "f32");
  EXPECT_STREQ(dtype_name(DType::kF64), "f64");
  EXPECT_STREQ(dtype_name(DType::kI32), "i32");
  EXPECT_EQ(dtype_size(DType::kBf16), 2u);
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
}

TEST(Tensor, ValuesAndBitsPerDtype) {
  Tensor b(DType::kBf16, {2});
  b.data<uint16_t>()[0] = 0x3F80;  // 1.0
  b.data<uint16_t>()[1] = 0xC0A0;  // -5.0
  EXPECT_EQ(b.value_at(0), 1.0);
  EXPECT_EQ(b.value_at(1), -5.0);
  EXPECT_EQ(b.bits_at(1), 0xC0A0u);

  Tensor f(DType::kF32, {1});
  f.data<float>()[0] = -0.0f;
  EXPECT_EQ(f.bits_at(0), 0x80000000u);
  Tensor d(DType::kF64, {1});
  d.data<double>()[0] = 0.5;
  EXPECT_EQ(d.value_at(0), 0.5);
  EXPECT_EQ(d.bits_at(0), 0x3FE0000000000000u);
  Tensor i(DType::kI32, {1});
  i.data<int32_t>()[0] = -1;
  EXPECT_EQ(i.value_at(0), -1.0);
  EXPECT_EQ(i.bits_at(0), 0xFFFFFFFFu);
  EXPECT_THROW(i.value_at(1), mok::Error);
}

TEST(Tensor, TypedAccessChecksDtype) {
  Tensor t(DType::kBf16, {2});
  EXPECT_NO_THROW(t.data<uint16_t>());
  try {
    t.data<float>();
    FAIL() << "expected mok::Error";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("float"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(TensorMap, AtNamesTheMissingKey) {
  TensorMap map;
  map.emplace("inputs/topk_experts", Tensor(DType::kI32, {1, 1}));
  EXPECT_EQ(at(map, "inputs/topk_experts").dtype(), DType::kI32);
  try {
    at(map, "inputs/x");
    FAIL() << "expected mok::Error";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'inputs/x' is missing"), std::string::npos) << e.what();
  }
  const TensorMap& cmap = map;
  EXPECT_THROW(at(cmap, "outputs/output"), mok::Error);
}

}  // namespace
}  // namespace mok::ref
