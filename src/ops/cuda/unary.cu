// CUDA unary elementwise ops through launch_elementwise (elementwise_launch.cuh): reads x,
// writes out (same dtype), fp32 math for 16-bit floats; clamp bounds travel by value.
#include <type_traits>

#include "core/dispatch.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/elementwise_launch.cuh"
#include "ops/elementwise_ops.h"

namespace kiln::cuda {

void unary(UnaryOp op, const Tensor& out, const Tensor& x, const EwParams& p) {
  dispatch_all(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    ew::visit(op, [&](auto c) {
      constexpr UnaryOp kOp = decltype(c)::value;
      if constexpr (std::is_same_v<T, bool> || (!std::is_floating_point_v<A> && !ew::integer_ok(kOp))) {
        KILN_FAIL("elementwise", "op not supported for ", dtype_name(out.dtype()));
      } else {
        const ew::Unary<kOp, A> f{ew::scalar_of<T>(p.lo), ew::scalar_of<T>(p.hi)};
        launch_elementwise<T, T>("elementwise", out, {&x}, f);
      }
    });
  });
}

}  // namespace kiln::cuda
