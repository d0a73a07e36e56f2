// Type promotion (PyTorch's rules): result_type for tensor pairs (dimensioned and 0-d) and tensor
// with a Scalar of each kind, each binary op's result dtype and values, bool results, wrapping
// integer arithmetic, in-place casts that must raise, and the CPU thread count.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "core/cpu/parallel.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

constexpr DType kAll[] = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32, kInt8, kUInt8, kBool};
constexpr DType F32 = kFloat32, F64 = kFloat64, BF = kBFloat16, F16 = kFloat16, I64 = kInt64, I32 = kInt32,
                I8 = kInt8, U8 = kUInt8, B = kBool;

// Rows and columns in kAll's order (PyTorch's torch.promote_types; uint8 with int8 gives int32 for
// PyTorch's int16, which kiln lacks).
constexpr DType kPromote[9][9] = {
    {F32, F64, F32, F32, F32, F32, F32, F32, F32}, {F64, F64, F64, F64, F64, F64, F64, F64, F64},
    {F32, F64, BF, F32, BF, BF, BF, BF, BF},       {F32, F64, F32, F16, F16, F16, F16, F16, F16},
    {F32, F64, BF, F16, I64, I64, I64, I64, I64},  {F32, F64, BF, F16, I64, I32, I32, I32, I32},
    {F32, F64, BF, F16, I64, I32, I8, I32, I8},    {F32, F64, BF, F16, I64, I32, I32, U8, U8},
    {F32, F64, BF, F16, I64, I32, I8, U8, B}};
// Row dimensioned, column 0-d.
constexpr DType kZeroDim[9][9] = {
    {F32, F32, F32, F32, F32, F32, F32, F32, F32}, {F64, F64, F64, F64, F64, F64, F64, F64, F64},
    {BF, BF, BF, BF, BF, BF, BF, BF, BF},          {F16, F16, F16, F16, F16, F16, F16, F16, F16},
    {F32, F64, BF, F16, I64, I64, I64, I64, I64},  {F32, F64, BF, F16, I32, I32, I32, I32, I32},
    {F32, F64, BF, F16, I8, I8, I8, I8, I8},       {F32, F64, BF, F16, U8, U8, U8, U8, U8},
    {F32, F64, BF, F16, I64, I32, I8, U8, B}};
// Row tensor with an int, a double, a bool Scalar.
constexpr DType kScalar[9][3] = {{F32, F32, F32}, {F64, F64, F64}, {BF, BF, BF},    {F16, F16, F16}, {I64, F32, I64},
                                 {I32, F32, I32}, {I8, F32, I8},   {U8, F32, U8},   {I64, F32, B}};

Tensor ones_of(DType dt, bool zero_dim = false) { return zero_dim ? ones({}, dt) : ones({3}, dt); }

std::vector<double> values(const Tensor& t) {
  const Tensor c = t.to(kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

}  // namespace

TEST(Promotion, ResultTypeTables) {
  for (int i = 0; i < 9; ++i) {
    for (int j = 0; j < 9; ++j) {
      SCOPED_TRACE(std::string(dtype_name(kAll[i])) + " with " + dtype_name(kAll[j]));
      EXPECT_EQ(result_type(ones_of(kAll[i]), ones_of(kAll[j])), kPromote[i][j]);
      EXPECT_EQ(result_type(ones_of(kAll[i], true), ones_of(kAll[j], true)), kPromote[i][j]);
      EXPECT_EQ(result_type(ones_of(kAll[i]), ones_of(kAll[j], true)), kZeroDim[i][j]);
      EXPECT_EQ(result_type(ones_of(kAll[j], true), ones_of(kAll[i])), kZeroDim[i][j]);
    }
    EXPECT_EQ(result_type(ones_of(kAll[i]), Scalar(2)), kScalar[i][0]);
    EXPECT_EQ(result_type(ones_of(kAll[i]), Scalar(2.5)), kScalar[i][1]);
    EXPECT_EQ(result_type(ones_of(kAll[i]), Scalar(true)), kScalar[i][2]);
  }
}

TEST(Promotion, EveryBinaryOpFollowsTheTable) {
  for (int i = 0; i < 9; ++i) {
    for (int j = 0; j < 9; ++j) {
      const Tensor a = ones_of(kAll[i]), b = ones_of(kAll[j]);
      const DType p = kPromote[i][j];
      SCOPED_TRACE(std::string(dtype_name(kAll[i])) + " with " + dtype_name(kAll[j]));
      EXPECT_EQ(add(a, b).dtype(), p);
      EXPECT_EQ(mul(a, b).dtype(), p);
      EXPECT_EQ(maximum(a, b).dtype(), p);
      EXPECT_EQ(minimum(a, b).dtype(), p);
      EXPECT_EQ(where(ones({3}, kBool), a, b).dtype(), p);
      EXPECT_EQ(div(a, b).dtype(), is_floating_point(p) ? p : kFloat32);
      EXPECT_EQ(lt(a, b).dtype(), kBool);
      if (a.dtype() == kBool || b.dtype() == kBool) {
        EXPECT_THROW(sub(a, b), Error);
      } else {
        EXPECT_EQ(sub(a, b).dtype(), p);
      }
      if (a.dtype() == kBool && b.dtype() == kBool) {
        EXPECT_THROW(pow(a, b), Error);
      } else {
        EXPECT_EQ(pow(a, b).dtype(), p);
      }
    }
  }
}

TEST(Promotion, ScalarsPromoteByKind) {
  const Tensor i = arange(0, 5, 1, kInt64);
  const Tensor x = i * 0.1;  // float32, not int64 zeros
  ASSERT_EQ(x.dtype(), kFloat32);
  const std::vector<double> xv = values(x);
  for (int k = 0; k < 5; ++k) EXPECT_NEAR(xv[static_cast<size_t>(k)], 0.1 * k, 1e-6);
  EXPECT_EQ(values(ones({3}, kInt64) + 0.5), (std::vector<double>{1.5, 1.5, 1.5}));
  EXPECT_EQ((ones({3}, kInt32) * 2).dtype(), kInt32);
  EXPECT_EQ((ones({3}, kBFloat16) * 0.5).dtype(), kBFloat16);
  EXPECT_EQ((ones({3}, kBool) + 1).dtype(), kInt64);
  EXPECT_EQ(values(lt(i, 2.5)), (std::vector<double>{1, 1, 1, 0, 0}));  // compared as float, not 2 < 2
  EXPECT_EQ(values(div(1, arange(1, 3, 1, kInt64))), (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(values(sub(5, i)), (std::vector<double>{5, 4, 3, 2, 1}));
  EXPECT_EQ(values(pow(2, i)), (std::vector<double>{1, 2, 4, 8, 16}));
  EXPECT_EQ(pow(2, i).dtype(), kInt64);
  EXPECT_EQ(pow(2.0, i).dtype(), kFloat32);
  EXPECT_EQ(where(gt(i, 1), i, 0.5).dtype(), kFloat32);
  EXPECT_EQ(values(where(gt(i, 1), i, 0.5)), (std::vector<double>{0.5, 0.5, 2, 3, 4}));
}

TEST(Promotion, BoolResultsAndIntegerWrapping) {
  const Tensor t = gt(arange(0, 4, 1, kInt64), 1), u = lt(arange(0, 4, 1, kInt64), 3);  // 0011, 1110
  EXPECT_EQ(values(add(t, u)), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(values(mul(t, u)), (std::vector<double>{0, 0, 1, 0}));
  EXPECT_EQ(values(maximum(t, u)), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(values(minimum(t, u)), (std::vector<double>{0, 0, 1, 0}));
  EXPECT_EQ(add(t, u).dtype(), kBool);
  EXPECT_EQ(values(div(t, u)).back(), std::numeric_limits<double>::infinity());
  EXPECT_THROW(sub(t, u), Error);
  EXPECT_THROW(sub(t, 1), Error);
  // uint8 arithmetic wraps (2 - 3 = 255), as in PyTorch, including a scalar and a 0-d operand.
  const Tensor a = full({2}, 2, kUInt8);
  EXPECT_EQ(values(sub(a, 3)), (std::vector<double>{255, 255}));
  EXPECT_EQ(values(sub(a, full({2}, 3, kUInt8))), (std::vector<double>{255, 255}));
  EXPECT_EQ(values(sub(a, full({}, 3, kInt64))), (std::vector<double>{255, 255}));
  EXPECT_EQ(values(add(a, -3)), (std::vector<double>{255, 255}));
}

TEST(Promotion, InPlaceRefusesAWiderResult) {
  Tensor t = ones({3}, kInt64);
  EXPECT_THROW(add_(t, 0.5), Error);
  EXPECT_THROW(add_(t, ones({3}, kFloat32)), Error);
  add_(t, 2);
  EXPECT_EQ(values(t), (std::vector<double>{3, 3, 3}));
  Tensor f = ones({3}, kBFloat16);
  mul_(f, ones({3}, kFloat64));  // computed in f64, stored as bf16
  EXPECT_EQ(f.dtype(), kBFloat16);
}

TEST(Promotion, GradientsFlowThroughScalarForms) {
  const Tensor x = full({3}, 2.0, TensorOptions(kFloat32).requires_grad(true));
  const Tensor y = add(sub(1.0, x), div(3.0, x));  // 1 - x + 3 / x
  sum(y).backward();
  for (double g : values(x.grad())) EXPECT_NEAR(g, -1.0 - 3.0 / 4.0, 1e-6);
}

TEST(Threads, SetAndGetNumThreads) {
  const int saved = get_num_threads();
  EXPECT_GE(saved, 1);
  set_num_threads(1);
  EXPECT_EQ(get_num_threads(), 1);
  const Tensor a = randn({700, 300}), b = randn({300, 200});
  const Tensor one = matmul(a, b), e1 = exp(a), s1 = sum(a, {1});
  set_num_threads(3);
  EXPECT_EQ(get_num_threads(), 3);
  // Results never depend on the thread count.
  EXPECT_EQ(values(matmul(a, b)), values(one));
  EXPECT_EQ(values(exp(a)), values(e1));
  EXPECT_EQ(values(sum(a, {1})), values(s1));
  EXPECT_THROW(set_num_threads(0), Error);
  set_num_threads(saved);
}

TEST(Threads, SmallWorkStaysOnOneThreadLargeWorkUsesEvery) {
  const int saved = get_num_threads();
  set_num_threads(4);
  const CpuTuning g = tuning().cpu;
  EXPECT_EQ(cpu::threads_for(512 * 64, g.elementwise_grain), 1);  // a [512, 64] op
  EXPECT_EQ(cpu::threads_for(512 * 64 * 64, g.gemm_grain), 1);     // linear [512, 64] x [64, 64]
  EXPECT_EQ(cpu::threads_for(2 * g.elementwise_grain, g.elementwise_grain), 2);  // one thread per grain
  EXPECT_EQ(cpu::threads_for(2048 * 2048, g.elementwise_grain), 4);
  EXPECT_EQ(cpu::threads_for(int64_t{2048} * 2048 * 1024, g.gemm_grain), 4);
  set_num_threads(saved);
}

TEST(Threads, GrainsComeFromTuning) {
  Tuning t = tuning();
  t.cpu.elementwise_grain = 1;  // everything parallel: still the same bits
  const Tensor a = randn({64, 64});
  const Tensor ref = mul(a, a);
  {
    TuningGuard guard(t);
    EXPECT_EQ(values(mul(a, a)), values(ref));
  }
  EXPECT_EQ(tuning().cpu.elementwise_grain, int64_t{1} << 16);
}
