// CUDA binary elementwise ops (tensor-tensor and tensor-scalar) and the fused backward
// kernels of the unary ops: an op id and dtype pick a functor from elementwise_ops.h, and
// launch_elementwise (elementwise_launch.cuh) runs it: 16-byte vectors when dense, OffsetCalc
// otherwise. Reads a and b (or a and a by-value scalar), writes out; compute in fp32 for 16-bit floats.
#include <type_traits>

#include "core/dispatch.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/elementwise_launch.cuh"
#include "ops/elementwise_ops.h"

namespace kiln::cuda {

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const EwParams& p) {
  dispatch_all(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    ew::visit(op, [&](auto c) {
      constexpr BinaryOp kOp = decltype(c)::value;
      if constexpr (std::is_same_v<T, bool> || (!std::is_floating_point_v<A> && !ew::integer_ok(kOp))) {
        KILN_FAIL("elementwise", "op not supported for ", dtype_name(out.dtype()));
      } else {
        const ew::Binary<kOp, A> f{ew::wrapping_as<A>(p.alpha), ew::scalar_as<A>(p.lo), ew::scalar_as<A>(p.hi)};
        launch_elementwise<T, T, T>("elementwise", out, {&a, &b}, f);
      }
    });
  });
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double b, const EwParams& p) {
  dispatch_all(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    ew::visit(op, [&](auto c) {
      constexpr BinaryOp kOp = decltype(c)::value;
      if constexpr (std::is_same_v<T, bool> || !ew::scalar_ok(kOp) ||
                    (!std::is_floating_point_v<A> && !ew::integer_ok(kOp))) {
        KILN_FAIL("elementwise", "op not supported for ", dtype_name(out.dtype()));
      } else {
        using F = ew::Binary<kOp, A>;
        const F f{ew::wrapping_as<A>(p.alpha), ew::scalar_as<A>(p.lo), ew::scalar_as<A>(p.hi)};
        launch_elementwise<T, T>("elementwise", out, {&a}, ew::BindRight<F, A>{f, ew::operand_of<kOp, T>(b)});
      }
    });
  });
}

}  // namespace kiln::cuda
