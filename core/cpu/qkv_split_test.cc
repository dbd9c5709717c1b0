// The fused QKV split + RoPE against the composition it replaces in
// layers/attention.cc (the oracle): index tables as ParallelAttention::MakeIds
// builds them, row gathers (EmbeddingForward), RopeForward in place, and
// backward the scatter-adds (EmbeddingBackward into zeroed f32 tables) around
// RopeBackward. Same float operations in the same order: bitwise equal.

#include "core/cpu/qkv_split.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/embedding.h"
#include "core/cpu/rope.h"
#include "core/cpu/test_util.h"
#include "gtest/gtest.h"

namespace loom::core::cpu::testing {
namespace {

struct Case {
  std::string name;
  int64_t s, b, heads, groups, d;
  bool rope;
  int64_t rotary_dim = 0, offset = 0;
  float base = 10000.0f;
};

QkvSplitOptions OptionsOf(const Case& c) {
  QkvSplitOptions o;
  o.heads = c.heads;
  o.groups = c.groups;
  o.rope = c.rope;
  o.rope_options.base = c.base;
  o.rope_options.rotary_dim = c.rotary_dim;
  o.rope_options.position_offset = c.offset;
  return o;
}

Shape ProjShape(const Case& c) {
  return Shape{c.s, c.b, c.groups * (c.heads / c.groups + 2) * c.d};
}
Shape QkvShape(const Case& c) { return Shape{c.s, c.b, c.heads * 3 * c.d}; }

Tensor I32(std::vector<int32_t> v) {
  Tensor t = Make(Shape{static_cast<int64_t>(v.size())}, DType::kI32);
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

// The layer's unfused path (layers/attention.cc at the commit before this op).
struct Unfused {
  const Case& c;
  int64_t rows, n, qk, width;
  Tensor gather, table;  // ids
  explicit Unfused(const Case& cs)
      : c(cs), rows(cs.s * cs.b), n(cs.heads / cs.groups), qk(cs.heads + cs.groups),
        width(cs.groups * (n + 2)) {
    auto proj_row = [&](int64_t t, int64_t g, int64_t j) {
      return static_cast<int32_t>(t * width + g * (n + 2) + j);
    };
    std::vector<int32_t> out(rows * c.heads * 3), tab;
    if (c.rope) {
      const int64_t v_base = rows * qk;
      tab.resize(rows * (qk + c.groups));
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t m = 0; m < c.heads; ++m) tab[t * qk + m] = proj_row(t, m / n, m % n);
        for (int64_t g = 0; g < c.groups; ++g) {
          tab[t * qk + c.heads + g] = proj_row(t, g, n);
          tab[v_base + t * c.groups + g] = proj_row(t, g, n + 1);
        }
        for (int64_t m = 0; m < c.heads; ++m) {
          int32_t* o = &out[(t * c.heads + m) * 3];
          o[0] = static_cast<int32_t>(t * qk + m);
          o[1] = static_cast<int32_t>(t * qk + c.heads + m / n);
          o[2] = static_cast<int32_t>(v_base + t * c.groups + m / n);
        }
      }
      table = I32(tab);
    } else {
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t m = 0; m < c.heads; ++m) {
          int32_t* o = &out[(t * c.heads + m) * 3];
          o[0] = proj_row(t, m / n, m % n);
          o[1] = proj_row(t, m / n, n);
          o[2] = proj_row(t, m / n, n + 1);
        }
      }
    }
    gather = I32(out);
  }
  EmbeddingOptions RowGather() const {
    EmbeddingOptions o;
    o.zero_out_of_range = true;
    return o;
  }
  RopeOptions Rope() const { return OptionsOf(c).rope_options; }

  Tensor Forward(const Tensor& proj) const {
    Tensor tab = *proj.Reshape(Shape{proj.numel() / c.d, c.d});
    if (c.rope) {
      Tensor rotated = Make(tab.shape());
      EXPECT_TRUE(EmbeddingForward(table, tab, &rotated, RowGather()).ok());
      Tensor qk_rows = *(*rotated.Narrow(0, rows * qk)).Reshape(Shape{c.s, c.b, qk, c.d});
      EXPECT_TRUE(RopeForward(qk_rows, Rope(), &qk_rows).ok());
      tab = rotated;
    }
    Tensor qkv = Make(QkvShape(c));
    Tensor out_rows = *qkv.Reshape(Shape{rows * c.heads * 3, c.d});
    EXPECT_TRUE(EmbeddingForward(gather, tab, &out_rows, RowGather()).ok());
    return qkv;
  }
  Tensor Backward(const Tensor& dqkv) const {
    const int64_t proj_rows = rows * width;
    Tensor in_rows = *dqkv.Reshape(Shape{rows * c.heads * 3, c.d});
    Tensor dproj = Make(Shape{proj_rows, c.d});
    std::memset(dproj.raw_data(), 0, dproj.nbytes());
    if (c.rope) {
      Tensor dtable = Make(Shape{proj_rows, c.d});
      std::memset(dtable.raw_data(), 0, dtable.nbytes());
      EXPECT_TRUE(EmbeddingBackward(gather, in_rows, &dtable, RowGather()).ok());
      Tensor dqk = *(*dtable.Narrow(0, rows * qk)).Reshape(Shape{c.s, c.b, qk, c.d});
      EXPECT_TRUE(RopeBackward(dqk, Rope(), &dqk).ok());
      EXPECT_TRUE(EmbeddingBackward(table, dtable, &dproj, RowGather()).ok());
    } else {
      EXPECT_TRUE(EmbeddingBackward(gather, in_rows, &dproj, RowGather()).ok());
    }
    return *dproj.Reshape(ProjShape(c));
  }
};

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Random values with exact zeros of both signs sprinkled in (0 + -0 is +0:
// the unfused path's zeroed tables turn -0 gradients into +0).
Tensor RandomWithZeros(const Shape& shape, uint64_t seed) {
  Tensor t = Random(shape, seed, -2.0f, 2.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); i += 7) p[i] = (i / 7) % 2 == 0 ? 0.0f : -0.0f;
  return t;
}

const std::vector<Case>& Cases() {
  static const std::vector<Case>* cases = new std::vector<Case>{
      // GPT-2: no GQA, no RoPE (the layer skips the rearrangement; the op is a copy).
      {"gpt2_shape", 16, 2, 12, 12, 64, false},
      {"llama_gqa_rope", 9, 2, 6, 2, 4, true, 0, 0, 50.0f},
      {"llama_model_shape", 16, 2, 32, 8, 128, true, 0, 0, 500000.0f},
      {"gqa_no_rope", 7, 3, 8, 2, 16, false},
      {"rope_no_gqa", 11, 2, 4, 4, 32, true},
      {"partial_rotary", 10, 2, 6, 3, 40, true, 16},
      {"half_rotary_odd_d", 5, 1, 4, 2, 10, true, 6},
      {"mqa_one_group", 6, 2, 8, 1, 8, true},
      // TP 2's slices of a 16-head, 4-group layer: 8 heads, 2 groups per rank.
      {"tp2_slice", 12, 2, 8, 2, 16, true},
      // A CP rank's second chunk: positions from an offset.
      {"cp_offset", 8, 2, 4, 2, 16, true, 0, 4096},
      {"ragged_one_token", 1, 1, 3, 1, 2, true},
  };
  return *cases;
}

TEST(QkvSplitTest, ForwardIsBitwiseTheGatherRotateComposition) {
  uint64_t seed = 11;
  for (const Case& c : Cases()) {
    const Tensor proj = RandomWithZeros(ProjShape(c), ++seed);
    Tensor qkv = Make(QkvShape(c));
    std::memset(qkv.raw_data(), 0xff, qkv.nbytes());  // NaN: every element must be written
    LOOM_ASSERT_OK(QkvSplitRopeForward(proj, OptionsOf(c), &qkv));
    EXPECT_TRUE(BitwiseEqual(qkv, Unfused(c).Forward(proj))) << c.name;
    if (c.heads == c.groups && !c.rope) {  // GPT-2's layout is already the kernel's
      EXPECT_TRUE(BitwiseEqual(qkv, proj.Reshape(QkvShape(c)).value())) << c.name;
    }
  }
}

TEST(QkvSplitTest, BackwardIsBitwiseTheScatterAddComposition) {
  uint64_t seed = 101;
  for (const Case& c : Cases()) {
    const Tensor dqkv = RandomWithZeros(QkvShape(c), ++seed);
    Tensor dproj = Make(ProjShape(c));
    std::memset(dproj.raw_data(), 0xff, dproj.nbytes());
    LOOM_ASSERT_OK(QkvSplitRopeBackward(dqkv, OptionsOf(c), &dproj));
    EXPECT_TRUE(BitwiseEqual(dproj, Unfused(c).Backward(dqkv))) << c.name;
  }
}

// Per-run calls at their offsets (how the layer handles CP's two chunks)
// give the whole call's bits.
TEST(QkvSplitTest, RowRunsAtTheirOffsetsMatchOneCall) {
  const Case c{"runs", 12, 2, 4, 2, 8, true};
  const Tensor proj = Random(ProjShape(c), 3);
  Tensor whole = Make(QkvShape(c)), parts = Make(QkvShape(c));
  LOOM_ASSERT_OK(QkvSplitRopeForward(proj, OptionsOf(c), &whole));
  for (const int64_t first : {0, 5}) {
    const int64_t count = first == 0 ? 5 : 7;
    QkvSplitOptions o = OptionsOf(c);
    o.rope_options.position_offset = first;
    Tensor out = *parts.Narrow(first, count);
    LOOM_ASSERT_OK(QkvSplitRopeForward(*proj.Narrow(first, count), o, &out));
  }
  EXPECT_TRUE(BitwiseEqual(whole, parts));
}

TEST(QkvSplitTest, RejectsBadArguments) {
  QkvSplitOptions o;
  o.heads = 4;
  o.groups = 2;
  const Tensor proj = Random(Shape{2, 1, 2 * 4 * 6}, 1);  // d = 6
  Tensor qkv = Make(Shape{2, 1, 4 * 3 * 6});
  LOOM_ASSERT_OK(QkvSplitRopeForward(proj, o, &qkv));
  QkvSplitOptions bad = o;
  bad.groups = 3;
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, bad, &qkv),
                                {"QkvSplitRopeForward", "heads 4, groups 3"}));
  bad = o;
  bad.heads = 0;
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, bad, &qkv), {"heads 0"}));
  bad = o;
  bad.rope = true;
  bad.rope_options.rotary_dim = 8;
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, bad, &qkv), {"rotary_dim is 8", "head dim 6"}));
  bad.rope_options.rotary_dim = 0;
  bad.rope_options.base = -1.0f;
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, bad, &qkv), {"base is -1"}));
  bad.rope_options.base = 10000.0f;
  bad.rope_options.position_offset = -3;
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, bad, &qkv), {"position_offset is -3"}));
  const Tensor ragged = Random(Shape{2, 1, 2 * 4 * 6 + 1}, 1);
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(ragged, o, &qkv), {"proj is", "with d > 0"}));
  Tensor wrong = Make(Shape{2, 1, 4 * 3 * 5});
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, o, &wrong), {"qkv is", "expected [2, 1, 72]"}));
  Tensor dproj = Make(Shape{2, 1, 2 * 4 * 6});
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeBackward(wrong, o, &dproj),
                                {"QkvSplitRopeBackward", "dqkv is"}));
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, o, nullptr), {"qkv"}));
  Tensor i32 = Make(Shape{2, 1, 4 * 3 * 6}, DType::kI32);
  EXPECT_TRUE(IsInvalidArgument(QkvSplitRopeForward(proj, o, &i32), {"qkv"}));
}

}  // namespace
}  // namespace loom::core::cpu::testing
