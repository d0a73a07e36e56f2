#pragma once
// CPU kernels of the reduction family (see src/ops/reduce.cpp for the geometry they receive).
#include "kiln/tensor.h"
#include "ops/reduce_geom.h"

namespace kiln::cpu {

// x read through g as [outer, r, inner]; out (kind's dtype) and indices (int64, ArgMax only) are
// contiguous and written at o * g.oo + i * g.oi. Either may be undefined for ArgMax. LogSumExp writes
// its fp32 statistic (fp64 for fp64 inputs) whatever the input dtype.
void reduce(ReduceKind kind, const Tensor& x, const ReduceGeom& g, const Tensor& out, const Tensor& indices);

// Backward helpers; every operand has dst's sizes (reduced results arrive expanded, stride 0).
void scale_broadcast(const Tensor& dst, const Tensor& src, double scale);       // dst = src * scale
void ties_mask(const Tensor& mask, const Tensor& x, const Tensor& y);           // mask = x == y (NaN == NaN)
void ties_grad(const Tensor& dst, const Tensor& mask, const Tensor& g, const Tensor& cnt);  // mask ? g / cnt : 0
void argmax_grad(const Tensor& dst, const Tensor& idx, const Tensor& iota, const Tensor& g);  // idx == iota ? g : 0
void lse_grad(const Tensor& dst, const Tensor& x, const Tensor& y, const Tensor& g);  // g * exp(x - y), y fp32/fp64

}  // namespace kiln::cpu
