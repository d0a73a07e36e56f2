// dropout: Philox mask from the global generator (reserve_philox), regenerated in backward from
// the saved (seed, offset) instead of being stored. p = 0 or training = false return the input.
#include "core/dispatch.h"
#include "core/generator.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/dropout.h"
#include "ops/cuda/dropout.h"

namespace kiln::nn::functional {
namespace {

void run_dropout(const Tensor& x, double p, const PhiloxState& st, const Tensor& out) {
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("dropout", cuda::dropout_apply(x, p, st.seed, st.offset, out));
  } else {
    cpu::dropout_apply(x, p, st.seed, st.offset, out);
  }
}

}  // namespace

Tensor dropout(const Tensor& x_in, double p, bool training) {
  KILN_CHECK(x_in.defined(), "dropout", "input is undefined");
  KILN_CHECK(p >= 0 && p <= 1, "dropout", "probability must be in [0, 1], got ", p);
  KILN_CHECK(is_floating_point(x_in.dtype()), "dropout", "expected a floating-point input, got ",
             dtype_name(x_in.dtype()));
  if (!training || p == 0) return x_in;
  const Tensor x = x_in.contiguous().detach();
  const PhiloxState st = reserve_philox(x.device(), x.numel());
  Tensor out = empty(x.sizes(), x.options());
  run_dropout(x, p, st, out);
  if (autograd::needs_grad({x_in})) {
    autograd::record("dropout", {out}, {x_in}, [p, st, dt = x.dtype()](const std::vector<Tensor>& g) {
      const Tensor dy = g[0].to(dt).contiguous();
      Tensor dx = empty(dy.sizes(), dy.options());
      run_dropout(dy, p, st, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

}  // namespace kiln::nn::functional
