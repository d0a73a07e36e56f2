#pragma once
// Helpers shared by the elementwise API files (binary, unary, compare): dtype categories, device
// checks, and launching an op id on the right backend. Internal to src/ops.
#include "kiln/ops.h"
#include "ops/elementwise_ops.h"

namespace kiln::ew {

// 0 bool, 1 integer, 2 floating.
int category(DType t);

// v as an integer dtype holds it, wrapped (uint8: -1 -> 255), so that integer add/sub/mul wrap
// as in PyTorch instead of the kernels' saturating conversion; floating dtypes keep v.
double wrap_integer(DType dtype, double v);

// The operand a Scalar becomes beside `like`: a 0-d CPU tensor of result_type(like, s)
// (it then widens `like` exactly as the Scalar would).
Tensor scalar_operand(const Tensor& like, Scalar s);

// Raises "[op] ... undefined tensor" / "[op] arithmetic on bool tensors is not supported".
void check_defined(const Tensor& t, const char* op);
void check_not_bool(DType t, const char* op);

// The device the op runs on. Tensors must share it, except a 0-d CPU tensor, which joins
// the other operand's device (PyTorch allows this for CPU scalars).
Device common_device(const std::vector<const Tensor*>& ts, const char* op);

// Fresh outputs. Inputs are converted to `dtype`, moved to `device` if 0-d CPU, and expanded;
// no autograd is recorded (callers record their own node).
Tensor run_binary(BinaryOp op, const Tensor& a, const Tensor& b, DType dtype, const EwParams& p, const char* name);
Tensor run_binary_scalar(BinaryOp op, const Tensor& a, double b, const EwParams& p, const char* name);
Tensor run_unary(UnaryOp op, const Tensor& x, const EwParams& p, const char* name);

// A gradient for an input of the given shape/dtype/device: sums broadcast dims away and converts.
struct InputMeta {
  Shape shape;
  DType dtype;
  Device device;
  explicit InputMeta(const Tensor& t) : shape(t.sizes()), dtype(t.dtype()), device(t.device()) {}
};
Tensor reduce_grad(const Tensor& g, const InputMeta& m);

}  // namespace kiln::ew
