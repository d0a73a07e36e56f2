// swiglu: silu(gate) * up as one op, one fused kernel each way (ops/cpu/swiglu.cpp,
// ops/cuda/swiglu.cu): the forward reads gate and up once, the backward reads grad, gate and up
// once and writes both gradients, where the composition makes three passes forward and five
// backward.
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/swiglu.h"
#include "ops/cuda/swiglu.h"

namespace kiln::nn::functional {

Tensor swiglu(const Tensor& gate_in, const Tensor& up_in) {
  const char* op = "swiglu";
  KILN_CHECK(gate_in.defined() && up_in.defined(), op, "gate and up must be defined");
  KILN_CHECK(gate_in.sizes() == up_in.sizes(), op, "gate and up must have the same shape, got ",
             shape_str(gate_in.sizes()), " and ", shape_str(up_in.sizes()));
  KILN_CHECK(gate_in.device() == up_in.device(), op, "gate is on ", gate_in.device(), " but up is on ",
             up_in.device());
  KILN_CHECK(is_floating_point(gate_in.dtype()) && gate_in.dtype() == up_in.dtype(), op,
             "gate and up must share one floating-point dtype, got ", dtype_name(gate_in.dtype()), " and ",
             dtype_name(up_in.dtype()));
  const Tensor gate = gate_in.contiguous().detach(), up = up_in.contiguous().detach();
  Tensor out = empty(gate.sizes(), gate.options());
  if (gate.is_cuda()) {
    KILN_CUDA_ONLY("swiglu", cuda::swiglu_forward(gate, up, out));
  } else {
    cpu::swiglu_forward(gate, up, out);
  }
  if (autograd::needs_grad({gate_in, up_in})) {
    autograd::record(op, {out}, {gate_in, up_in},
                     [sg = SavedTensor(gate), su = SavedTensor(up)](const std::vector<Tensor>& g) {
                       const Tensor gs = sg.unpack("swiglu"), us = su.unpack("swiglu");
                       const Tensor dy = g[0].to(gs.dtype()).contiguous();
                       Tensor dgate = empty(gs.sizes(), gs.options()), dup = empty(gs.sizes(), gs.options());
                       if (gs.is_cuda()) {
                         KILN_CUDA_ONLY("swiglu", cuda::swiglu_backward(dy, gs, us, dgate, dup));
                       } else {
                         cpu::swiglu_backward(dy, gs, us, dgate, dup);
                       }
                       return std::vector<Tensor>{dgate, dup};
                     });
  }
  return out;
}

}  // namespace kiln::nn::functional
