// kiln::optim as kiln._C._optim: the AdamW and SGD objects (kiln.optim keeps PyTorch's
// param_groups dicts and pushes each group's hyperparameters here before a step), global-norm
// gradient clipping and the warmup + cosine learning-rate formula.
#include "bind.h"
#include "kiln/optim.h"

namespace kiln::py {
namespace {

using optim::AdamW;
using optim::AdamWOptions;
using optim::SGD;
using optim::SGDOptions;

AdamWOptions adamw_options(double lr, double beta1, double beta2, double eps, double weight_decay) {
  AdamWOptions o;
  o.lr = lr, o.beta1 = beta1, o.beta2 = beta2, o.eps = eps, o.weight_decay = weight_decay;
  return o;
}

SGDOptions sgd_options(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                       bool maximize) {
  SGDOptions o;
  o.lr = lr, o.momentum = momentum, o.dampening = dampening, o.weight_decay = weight_decay;
  o.nesterov = nesterov, o.maximize = maximize;
  return o;
}

template <typename Group>
Group& group_at(std::vector<Group>& groups, size_t i, const char* op) {
  KILN_CHECK(i < groups.size(), op, "param group ", i, " out of range for ", groups.size(), " groups");
  return groups[i];
}

}  // namespace

void bind_optim(nb::module_& m) {
  nb::module_ sub = m.def_submodule("_optim", "kiln::optim (kiln.optim builds its optimizers on these)");
  const auto nogil = nb::call_guard<nb::gil_scoped_release>();

  nb::class_<AdamW>(sub, "AdamW")
      .def("__init__", [](AdamW* self, const std::vector<std::vector<Tensor>>& groups) {
        std::vector<optim::ParamGroup> g;
        for (const auto& params : groups) g.push_back({params, AdamWOptions{}});
        new (self) AdamW(std::move(g));
      }, "groups"_a, "one list of parameters per group (options set per group with set_group)")
      .def("set_group", [](AdamW& opt, size_t i, double lr, double beta1, double beta2, double eps, double wd) {
        group_at(opt.param_groups(), i, "AdamW").options = adamw_options(lr, beta1, beta2, eps, wd);
      }, "index"_a, "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a)
      .def("step", &AdamW::step, nogil)
      .def("zero_grad", &AdamW::zero_grad, "set_to_none"_a = true)
      .def("state", [](const AdamW& opt) {
        nb::list out;
        for (const optim::AdamWState& s : opt.state())
          out.append(nb::make_tuple(s.step, tensor_or_none(s.exp_avg), tensor_or_none(s.exp_avg_sq)));
        return out;
      }, "per parameter (flat index): (step, exp_avg or None, exp_avg_sq or None)")
      .def("load_state", [](AdamW& opt, const std::vector<std::tuple<int64_t, std::optional<Tensor>,
                                                                       std::optional<Tensor>>>& state) {
        std::vector<optim::AdamWState> s;
        for (const auto& [step, m, v] : state) s.push_back({step, m ? *m : Tensor(), v ? *v : Tensor()});
        opt.load_state(s);
      }, "state"_a);

  nb::class_<SGD>(sub, "SGD")
      .def("__init__", [](SGD* self, const std::vector<std::vector<Tensor>>& groups) {
        std::vector<optim::SGDParamGroup> g;
        for (const auto& params : groups) g.push_back({params, SGDOptions{}});
        new (self) SGD(std::move(g));
      }, "groups"_a)
      .def("set_group", [](SGD& opt, size_t i, double lr, double momentum, double dampening, double wd,
                           bool nesterov, bool maximize) {
        group_at(opt.param_groups(), i, "SGD").options = sgd_options(lr, momentum, dampening, wd, nesterov, maximize);
      }, "index"_a, "lr"_a, "momentum"_a, "dampening"_a, "weight_decay"_a, "nesterov"_a, "maximize"_a)
      .def("step", &SGD::step, nogil, "checks each group's options, then updates")
      .def("zero_grad", &SGD::zero_grad, "set_to_none"_a = true)
      .def("state", [](const SGD& opt) {
        nb::list out;
        for (const Tensor& b : opt.state()) out.append(tensor_or_none(b));
        return out;
      }, "per parameter (flat index): the momentum buffer or None")
      .def("load_state", [](SGD& opt, const std::vector<std::optional<Tensor>>& buffers) {
        std::vector<Tensor> b;
        for (const auto& t : buffers) b.push_back(t ? *t : Tensor());
        opt.load_state(b);
      }, "state"_a);

  sub.def("clip_grad_norm_", &optim::clip_grad_norm_, "parameters"_a, "max_norm"_a, nogil,
          "scales every gradient by min(1, max_norm / (total_norm + 1e-6)) -> total_norm [] float32");
  sub.def("warmup_cosine_lr", &optim::warmup_cosine_lr, "step"_a, "warmup_steps"_a, "total_steps"_a, "max_lr"_a,
          "min_lr"_a = 0.0, "linear warmup to max_lr over warmup_steps, then cosine decay to min_lr at total_steps");
}

}  // namespace kiln::py
