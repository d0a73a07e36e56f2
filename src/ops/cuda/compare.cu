// CUDA comparisons (bool out; operands share a dtype) and where(cond, a, b), through
// launch_elementwise (elementwise_launch.cuh). Scalars travel by value in the functor.
#include "core/dispatch.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/elementwise_launch.cuh"
#include "ops/elementwise_ops.h"

namespace kiln::cuda {

void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_all(a.dtype(), "compare", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ew::visit(op, [&](auto c) {
      launch_elementwise<bool, T, T>("compare", out, {&a, &b}, ew::Compare<decltype(c)::value>{});
    });
  });
}

void compare_scalar(CompareOp op, const Tensor& out, const Tensor& a, double b) {
  dispatch_all(a.dtype(), "compare", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    ew::visit(op, [&](auto c) {
      launch_elementwise<bool, T>("compare", out, {&a}, ew::CompareRight<decltype(c)::value, A>{ew::scalar_of<T>(b)});
    });
  });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  dispatch_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<T, bool, T, T>("where", out, {&cond, &a, &b}, ew::Select<acc_t<T>>{});
  });
}

}  // namespace kiln::cuda
