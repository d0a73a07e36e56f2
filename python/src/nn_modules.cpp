// The C++ modules (kiln::nn) as kiln._C._nn: kiln.nn's Python layers build their C++ counterpart,
// whose constructor checks the arguments and draws the initial weights, and adopt its parameters
// (so one seed gives the same model in C++ and Python); tests train the C++ modules directly to
// compare. Also the two helpers kiln.nn needs: a Tensor subclass instance sharing a tensor
// (nn.Parameter) and the in-place move behind Module.to().
#include <nanobind/stl/shared_ptr.h>

#include <new>

#include "bind.h"
#include "kiln/nn.h"
#include "kiln/ops.h"

namespace kiln::py {
namespace {

TensorOptions options_of(std::optional<DType> dtype, std::optional<Device> device) {
  TensorOptions o;
  if (dtype) o = o.dtype(*dtype);
  if (device) o = o.device(*device);
  return o;
}

nb::list named(const std::vector<std::pair<std::string, Tensor>>& items) {
  nb::list out;
  for (const auto& [name, t] : items) out.append(nb::make_tuple(name, t));
  return out;
}

std::function<Tensor(const Tensor&)> activation(const std::string& name) {
  if (name == "relu") return [](const Tensor& x) { return relu(x); };
  if (name == "gelu") return [](const Tensor& x) { return gelu(x); };
  if (name == "silu") return [](const Tensor& x) { return silu(x); };
  if (name == "tanh") return [](const Tensor& x) { return kiln::tanh(x); };
  KILN_FAIL("Functional", "unknown activation '", name, "' (relu, gelu, silu, tanh)");
}

}  // namespace

void bind_nn_modules(nb::module_& m) {
  m.def(
      "_make_subclass",
      [](nb::handle cls, const Tensor& t) {
        const nb::handle base = nb::type<Tensor>();
        if (!PyType_Check(cls.ptr()) ||
            !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), reinterpret_cast<PyTypeObject*>(base.ptr())))
          throw nb::type_error("_make_subclass: cls must be a subclass of kiln.Tensor");
        nb::object obj = nb::inst_alloc(cls);
        new (nb::inst_ptr<Tensor>(obj)) Tensor(t);  // a handle to the same tensor (impl shared)
        nb::inst_mark_ready(obj);
        return obj;
      },
      "cls"_a, "tensor"_a, "an instance of the Tensor subclass `cls` that is the same tensor as `tensor`");

  nb::module_ sub = m.def_submodule("_nn", "kiln::nn's C++ modules (kiln.nn builds its layers on them)");
  sub.def(
      "move_",
      [](const std::vector<Tensor>& tensors, std::optional<Device> device, std::optional<DType> dtype) {
        // nn::Module::to moves registered tensors in place (every handle sees the move); a scratch
        // module registers the given tensors unchanged (requires_grad kept) to reuse it.
        nn::Module scratch;
        for (size_t i = 0; i < tensors.size(); ++i)
          scratch.register_parameter("t" + std::to_string(i), tensors[i], tensors[i].requires_grad());
        nb::gil_scoped_release release;
        if (device && dtype) scratch.to(*device, *dtype);
        else if (device) scratch.to(*device);
        else if (dtype) scratch.to(*dtype);
      },
      "tensors"_a, "device"_a = nb::none(), "dtype"_a = nb::none(),
      "moves leaf tensors in place (a dtype applies to floating-point ones); gradients move along");

  nb::class_<nn::Module>(sub, "Module")
      .def(nb::init<>())
      .def("forward", &nn::Module::forward, "x"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("__call__", &nn::Module::forward, "x"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("named_parameters", [](const nn::Module& mod) { return named(mod.named_parameters()); })
      .def("named_buffers", [](const nn::Module& mod) { return named(mod.named_buffers()); })
      .def("parameters", [](const nn::Module& mod) { return mod.parameters(); })
      .def("register_module", [](nn::Module& mod, const std::string& name, std::shared_ptr<nn::Module> child) {
        mod.register_module(name, std::move(child));
      }, "name"_a, "module"_a)
      .def("train", &nn::Module::train, "mode"_a = true)
      .def("zero_grad", &nn::Module::zero_grad, "set_to_none"_a = true)
      .def_prop_ro("training", &nn::Module::is_training)
      .def_prop_ro("type_name", &nn::Module::type_name);

  nb::class_<nn::Linear, nn::Module>(sub, "Linear")
      .def("__init__", [](nn::Linear* self, int64_t in, int64_t out, bool bias, std::optional<DType> dtype,
                          std::optional<Device> device) {
        new (self) nn::Linear(in, out, bias, options_of(dtype, device));
      }, "in_features"_a, "out_features"_a, "bias"_a = true, "dtype"_a = nb::none(), "device"_a = nb::none());
  nb::class_<nn::Embedding, nn::Module>(sub, "Embedding")
      .def("__init__", [](nn::Embedding* self, int64_t num, int64_t dim, std::optional<DType> dtype,
                          std::optional<Device> device) {
        new (self) nn::Embedding(num, dim, options_of(dtype, device));
      }, "num_embeddings"_a, "embedding_dim"_a, "dtype"_a = nb::none(), "device"_a = nb::none());
  nb::class_<nn::RMSNorm, nn::Module>(sub, "RMSNorm")
      .def("__init__", [](nn::RMSNorm* self, int64_t dim, double eps, std::optional<DType> dtype,
                          std::optional<Device> device) {
        new (self) nn::RMSNorm(dim, eps, options_of(dtype, device));
      }, "dim"_a, "eps"_a = 1e-6, "dtype"_a = nb::none(), "device"_a = nb::none());
  nb::class_<nn::Dropout, nn::Module>(sub, "Dropout").def(nb::init<double>(), "p"_a = 0.5);
  nb::class_<nn::Functional, nn::Module>(sub, "Activation")
      .def("__init__", [](nn::Functional* self, const std::string& name) {
        new (self) nn::Functional(activation(name), name);
      }, "name"_a, "a parameter-free activation module: 'relu', 'gelu', 'silu' or 'tanh'");
  nb::class_<nn::Sequential, nn::Module>(sub, "Sequential")
      .def(nb::init<>())
      .def("append", &nn::Sequential::push_back, "module"_a)
      .def("__len__", &nn::Sequential::size);
}

}  // namespace kiln::py
