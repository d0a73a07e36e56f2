// AdamW: state management and dispatch to the fused multi-tensor kernels (optim/cpu/kernels.cpp:
// every CPU parameter in one parallel pass; optim/cuda/kernels.cu: a few launches per device). Bias
// corrections are computed on the host in fp64 and folded into two scalars, as
// torch.optim.AdamW's single-tensor path does.
#include <cmath>
#include <map>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/optim.h"
#include "optim/cpu/kernels.h"
#include "optim/cuda/kernels.h"
#include "optim/param_checks.h"

namespace kiln::optim {
namespace {

DType state_dtype(DType param) { return is_low_precision(param) ? kFloat32 : param; }

void check_options(const AdamWOptions& o) {
  KILN_CHECK(o.lr >= 0, "AdamW", "learning rate must be >= 0, got ", o.lr);
  KILN_CHECK(o.eps >= 0, "AdamW", "invalid eps ", o.eps);
  KILN_CHECK(o.beta1 >= 0 && o.beta1 < 1, "AdamW", "invalid beta1 ", o.beta1);
  KILN_CHECK(o.beta2 >= 0 && o.beta2 < 1, "AdamW", "invalid beta2 ", o.beta2);
  KILN_CHECK(o.weight_decay >= 0, "AdamW", "invalid weight_decay ", o.weight_decay);
}

}  // namespace

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : AdamW(std::vector<ParamGroup>{{std::move(params), options}}) {}

AdamW::AdamW(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  size_t count = 0;
  for (const ParamGroup& g : groups_) {
    check_options(g.options);
    count = detail::check_parameters("AdamW", g.params, count);
  }
  state_.resize(count);
}

void AdamW::step() {
  NoGradGuard no_grad;
  size_t index = 0;
  std::vector<cpu::AdamWTensors> on_cpu;  // updated together after the loop (one multi-tensor pass)
  std::map<int, std::vector<cpu::AdamWTensors>> on_cuda;  // the same per CUDA device
  for (const ParamGroup& group : groups_) {
    const AdamWOptions& o = group.options;
    check_options(o);
    for (const Tensor& p : group.params) {
      AdamWState& st = state_[index++];
      const Tensor& grad_in = p.grad();
      if (!grad_in.defined()) continue;
      KILN_CHECK(p.is_contiguous(), "AdamW", "parameter ", index - 1, " must be contiguous");
      KILN_CHECK(grad_in.device() == p.device(), "AdamW", "gradient of parameter ", index - 1, " is on ",
                 grad_in.device(), " but the parameter is on ", p.device());
      const Tensor grad = grad_in.to(p.dtype()).contiguous();
      if (!st.exp_avg.defined()) {
        st.exp_avg = zeros(p.sizes(), p.options().dtype(state_dtype(p.dtype())));
        st.exp_avg_sq = zeros(p.sizes(), st.exp_avg.options());
      }
      st.step += 1;
      const double t = static_cast<double>(st.step);
      cpu::AdamWScalars s{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay,
                          o.lr / (1.0 - std::pow(o.beta1, t)), std::sqrt(1.0 - std::pow(o.beta2, t))};
      if (p.is_cuda()) {
        on_cuda[p.device().index].push_back({p, grad, st.exp_avg, st.exp_avg_sq, s});
      } else {
        on_cpu.push_back({p, grad, st.exp_avg, st.exp_avg_sq, s});
      }
      p.bump_version();
      st.exp_avg.bump_version();
      st.exp_avg_sq.bump_version();
    }
  }
  if (!on_cpu.empty()) cpu::adamw_step(on_cpu);
  if (!on_cuda.empty()) KILN_CUDA_ONLY("adamw", for (const auto& [device, list] : on_cuda) cuda::adamw_step(list));
}

void AdamW::zero_grad(bool set_to_none) {
  for (ParamGroup& group : groups_) detail::zero_grads(group.params, set_to_none);
}

void AdamW::set_lr(double lr) {
  KILN_CHECK(lr >= 0, "AdamW", "learning rate must be >= 0, got ", lr);
  for (ParamGroup& g : groups_) g.options.lr = lr;
}

double AdamW::lr() const {
  KILN_CHECK(!groups_.empty(), "AdamW", "no parameter groups");
  return groups_[0].options.lr;
}

AdamWState& AdamW::state(size_t index) {
  KILN_CHECK(index < state_.size(), "AdamW", "state index ", index, " out of range for ", state_.size(),
             " parameters");
  return state_[index];
}

void AdamW::load_state(const std::vector<AdamWState>& state) {
  KILN_CHECK(state.size() == state_.size(), "AdamW", "state has ", state.size(), " entries but the optimizer has ",
             state_.size(), " parameters");
  std::vector<AdamWState> loaded(state.size());
  size_t index = 0;
  for (const ParamGroup& group : groups_)
    for (const Tensor& p : group.params) {
      const AdamWState& in = state[index];
      AdamWState& out = loaded[index];
      KILN_CHECK(in.step >= 0, "AdamW", "negative step in state ", index);
      KILN_CHECK(in.exp_avg.defined() == in.exp_avg_sq.defined(), "AdamW", "state ", index,
                 " has only one of exp_avg / exp_avg_sq");
      out.step = in.step;
      if (in.exp_avg.defined()) {
        KILN_CHECK(in.exp_avg.sizes() == p.sizes() && in.exp_avg_sq.sizes() == p.sizes(), "AdamW", "state ", index,
                   " has moments of shape ", shape_str(in.exp_avg.sizes()), " for a parameter of shape ",
                   shape_str(p.sizes()));
        const DType dt = state_dtype(p.dtype());
        out.exp_avg = in.exp_avg.detach().to(p.device(), dt).contiguous().clone();
        out.exp_avg_sq = in.exp_avg_sq.detach().to(p.device(), dt).contiguous().clone();
      }
      ++index;
    }
  state_ = std::move(loaded);
}

double warmup_cosine_lr(int64_t step, int64_t warmup_steps, int64_t total_steps, double max_lr, double min_lr) {
  KILN_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps, "warmup_cosine_lr",
             "need 0 <= warmup_steps <= total_steps, got ", warmup_steps, " and ", total_steps);
  // A negative step would give a negative rate during warm-up (and AdamW would blame the rate).
  KILN_CHECK(step >= 0, "warmup_cosine_lr", "step must be >= 0, got ", step);
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps || total_steps == warmup_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress));
}

}  // namespace kiln::optim
