// SGD with momentum, composed of kiln's in-place tensor ops (add_, mul_), so it runs on every
// device the ops do. 16-bit parameters are updated through an fp32 copy with an fp32 buffer, so
// small steps are not lost to rounding in the buffer.
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "kiln/optim.h"
#include "optim/param_checks.h"

namespace kiln::optim {
namespace {

void check_options(const SGDOptions& o) {
  KILN_CHECK(o.lr >= 0, "SGD", "learning rate must be >= 0, got ", o.lr);
  KILN_CHECK(o.momentum >= 0, "SGD", "invalid momentum value: ", o.momentum);
  KILN_CHECK(o.weight_decay >= 0, "SGD", "invalid weight_decay value: ", o.weight_decay);
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD",
             "Nesterov momentum requires a momentum and zero dampening");
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD(std::vector<SGDParamGroup>{{std::move(params), options}}) {}

SGD::SGD(std::vector<SGDParamGroup> groups) : groups_(std::move(groups)) {
  size_t count = 0;
  for (const SGDParamGroup& g : groups_) {
    check_options(g.options);
    count = detail::check_parameters("SGD", g.params, count);
  }
  momentum_buffers_.resize(count);
}

void SGD::step() {
  NoGradGuard no_grad;
  size_t index = 0;
  for (const SGDParamGroup& group : groups_) {
    const SGDOptions& o = group.options;
    check_options(o);
    for (const Tensor& param : group.params) {
      Tensor& buf = momentum_buffers_[index++];
      if (!param.grad().defined()) continue;
      KILN_CHECK(param.grad().device() == param.device(), "SGD", "gradient of parameter ", index - 1, " is on ",
                 param.grad().device(), " but the parameter is on ", param.device());
      const bool low = is_low_precision(param.dtype());
      const DType math = low ? kFloat32 : param.dtype();
      Tensor p = low ? param.detach().to(kFloat32) : param.detach();
      Tensor g = param.grad().to(math);
      if (o.maximize) g = -g;
      if (o.weight_decay != 0) g = g + p * o.weight_decay;
      if (o.momentum != 0) {
        if (!buf.defined()) {
          buf = g.clone();
        } else {
          mul_(buf, o.momentum);
          add_(buf, g, 1.0 - o.dampening);
        }
        g = o.nesterov ? g + buf * o.momentum : buf;
      }
      add_(p, g, -o.lr);
      if (low) {
        Tensor target = param.detach();
        target.copy_(p);
      }
      param.bump_version();
    }
  }
}

void SGD::zero_grad(bool set_to_none) {
  for (SGDParamGroup& group : groups_) detail::zero_grads(group.params, set_to_none);
}

void SGD::set_lr(double lr) {
  KILN_CHECK(lr >= 0, "SGD", "learning rate must be >= 0, got ", lr);
  for (SGDParamGroup& g : groups_) g.options.lr = lr;
}

double SGD::lr() const {
  KILN_CHECK(!groups_.empty(), "SGD", "no parameter groups");
  return groups_[0].options.lr;
}

void SGD::load_state(const std::vector<Tensor>& momentum_buffers) {
  KILN_CHECK(momentum_buffers.size() == momentum_buffers_.size(), "SGD", "state has ", momentum_buffers.size(),
             " entries but the optimizer has ", momentum_buffers_.size(), " parameters");
  std::vector<Tensor> loaded(momentum_buffers.size());
  size_t index = 0;
  for (const SGDParamGroup& group : groups_)
    for (const Tensor& p : group.params) {
      const Tensor& in = momentum_buffers[index];
      if (in.defined()) {
        KILN_CHECK(in.sizes() == p.sizes(), "SGD", "state ", index, " has a momentum buffer of shape ",
                   shape_str(in.sizes()), " for a parameter of shape ", shape_str(p.sizes()));
        const DType dt = is_low_precision(p.dtype()) ? kFloat32 : p.dtype();
        loaded[index] = in.detach().to(p.device(), dt).contiguous().clone();
      }
      ++index;
    }
  momentum_buffers_ = std::move(loaded);
}

}  // namespace kiln::optim
