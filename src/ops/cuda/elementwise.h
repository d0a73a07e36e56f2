#pragma once
// CUDA elementwise kernels (no CUDA headers here, so .cpp files can include it). Operands already have out's sizes (broadcast by expand()) and, for
// binary/unary ops, out's dtype; strides are free. Scalars come by value.
#include "kiln/tensor.h"
#include "ops/elementwise_ops.h"

namespace kiln::cuda {
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const EwParams& p);
void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double b, const EwParams& p);
void unary(UnaryOp op, const Tensor& out, const Tensor& x, const EwParams& p);
// out: bool; a and b share a dtype.
void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void compare_scalar(CompareOp op, const Tensor& out, const Tensor& a, double b);
// cond: bool; a, b: out's dtype.
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
}  // namespace kiln::cuda
