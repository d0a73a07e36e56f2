// cross_entropy: the unfused reference with PyTorch's semantics (class weights, ignore_index,
// mean/sum/none, label smoothing). Forward keeps the per-row logsumexp (and, for mean, the sum
// of target weights) so backward is one pass over the logits.
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autocast.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/loss.h"
#include "ops/cuda/loss.h"

namespace kiln::nn::functional {

static Tensor cross_entropy_impl(const Tensor& logits_in, const Tensor& target_in, const CrossEntropyOptions& options) {
  const char* op = "cross_entropy";
  KILN_CHECK(logits_in.defined() && target_in.defined(), op, "logits and target must be defined");
  KILN_CHECK(logits_in.dim() == 2, op, "logits must be [N, C], got ", shape_str(logits_in.sizes()));
  KILN_CHECK(is_floating_point(logits_in.dtype()), op, "logits must be floating point, got ",
             dtype_name(logits_in.dtype()));
  KILN_CHECK(target_in.dtype() == kInt64 || target_in.dtype() == kInt32, op,
             "target must be int64 or int32 class indices, got ", dtype_name(target_in.dtype()));
  const int64_t N = logits_in.size(0), C = logits_in.size(1);
  KILN_CHECK(target_in.dim() == 1 && target_in.size(0) == N, op, "target must be [", N, "] for logits ",
             shape_str(logits_in.sizes()), ", got ", shape_str(target_in.sizes()));
  KILN_CHECK(C > 0, op, "logits need at least one class");
  KILN_CHECK(target_in.device() == logits_in.device(), op, "target is on ", target_in.device(),
             " but logits are on ", logits_in.device());
  KILN_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1, op,
             "label_smoothing must be in [0, 1], got ", options.label_smoothing);
  const DType stat = logits_in.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor weight;
  if (options.weight.defined()) {
    KILN_CHECK(options.weight.dim() == 1 && options.weight.size(0) == C, op, "weight must be [", C, "], got ",
               shape_str(options.weight.sizes()));
    KILN_CHECK(is_floating_point(options.weight.dtype()), op, "weight must be floating point");
    KILN_CHECK(options.weight.device() == logits_in.device(), op, "weight is on ", options.weight.device(),
               " but logits are on ", logits_in.device());
    weight = options.weight.detach().to(stat).contiguous();
  }
  const Tensor logits = logits_in.contiguous().detach();
  const Tensor target = target_in.contiguous().detach();
  const bool on_cuda = logits.is_cuda();
  const int64_t ignore = options.ignore_index;
  const double eps = options.label_smoothing;

  Tensor lse = empty({N}, logits.options().dtype(stat));
  Tensor row_loss = empty({N}, lse.options()), row_weight = empty({N}, lse.options());
  if (on_cuda) {
    KILN_CUDA_ONLY(op, cuda::cross_entropy_rows(logits, target, weight, ignore, eps, lse, row_loss, row_weight));
  } else {
    cpu::cross_entropy_rows(logits, target, weight, ignore, eps, lse, row_loss, row_weight);
  }
  Tensor out, total_weight;
  if (options.reduction == Reduction::None) {
    out = row_loss.to(logits.dtype());
  } else {
    const bool mean = options.reduction == Reduction::Mean;
    out = empty({}, logits.options());
    if (mean) total_weight = empty({}, lse.options());
    if (on_cuda) {
      KILN_CUDA_ONLY(op, cuda::cross_entropy_reduce(row_loss, row_weight, mean, out, total_weight));
    } else {
      cpu::cross_entropy_reduce(row_loss, row_weight, mean, out, total_weight);
    }
  }
  if (autograd::needs_grad({logits_in})) {
    autograd::record(op, {out}, {logits_in},
                     [sl = SavedTensor(logits), st = SavedTensor(target), weight, lse, total_weight, ignore, eps,
                      in_shape = logits_in.sizes()](const std::vector<Tensor>& g) {
                       const Tensor x = sl.unpack("cross_entropy"), t = st.unpack("cross_entropy");
                       const Tensor grad = g[0].to(x.dtype()).contiguous();
                       Tensor dx = empty(x.sizes(), x.options());
                       if (x.is_cuda()) {
                         KILN_CUDA_ONLY("cross_entropy_backward",
                                        cuda::cross_entropy_backward(grad, x, t, weight, lse, total_weight, ignore,
                                                                     eps, dx));
                       } else {
                         cpu::cross_entropy_backward(grad, x, t, weight, lse, total_weight, ignore, eps, dx);
                       }
                       return std::vector<Tensor>{dx.view(in_shape)};
                     });
  }
  return out;
}

// Autocast: losses run in fp32.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  return cross_entropy_impl(autocast::cast_fp32(logits), target, options);
}

}  // namespace kiln::nn::functional
