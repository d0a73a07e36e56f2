// clip_grad_norm_: the global L2 norm of all gradients (fp64 partial sums in a fixed order),
// then an in-place scale by min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_.
// On CUDA the coefficient never leaves the device.
#include <cmath>

#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/optim.h"
#include "optim/cpu/kernels.h"
#include "optim/cuda/kernels.h"

namespace kiln::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  KILN_CHECK(max_norm >= 0 && !std::isnan(max_norm), "clip_grad_norm_", "max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return zeros({});
  const Device device = grads[0].device();
  for (const Tensor& g : grads)
    KILN_CHECK(g.device() == device, "clip_grad_norm_", "gradients are on different devices: ", device, " and ",
               g.device());
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    Tensor slots = empty({static_cast<int64_t>(grads.size())}, TensorOptions(kFloat64).device(device));
    std::vector<Tensor> work;
    for (const Tensor& g : grads) work.push_back(g.is_contiguous() ? g : g.contiguous());
    cuda::grad_sumsq(work, slots);
    Tensor total = empty({}, TensorOptions(kFloat32).device(device));
    Tensor coef = empty({}, TensorOptions(kFloat64).device(device));
    cuda::clip_coefficient(slots, max_norm, total, coef);
    cuda::scale_by(work, coef);
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!work[i].is_same(grads[i])) grads[i].copy_(work[i]);
      grads[i].bump_version();
    }
    return total;
#else
    KILN_FAIL("clip_grad_norm_", "kiln was built without CUDA");
#endif
  }
  double sumsq = 0;
  for (const Tensor& g : grads) sumsq += cpu::grad_sumsq(g.contiguous());
  const double norm = std::sqrt(sumsq);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (Tensor& g : grads) {
      Tensor work = g.is_contiguous() ? g : g.contiguous();
      cpu::scale_(work, coef);
      if (!work.is_same(g)) g.copy_(work);
      g.bump_version();
    }
  }
  return scalar_tensor(norm, kFloat32);
}

}  // namespace kiln::optim
