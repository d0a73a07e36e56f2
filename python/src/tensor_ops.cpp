// The tensor functions a PyTorch user reaches for first: min/argmin, var/std/norm, chunk/split/unbind,
// masks (masked_fill, tril/triu, isnan..., isclose, logical ops, any/all, nonzero, t[mask]), in-place
// updates (sqrt_, addcmul_, lerp_, ...), topk/sort, einsum, and kiln.Generator with the random
// functions that take one. kiln/_tensor_ops.py gives them PyTorch's signatures and method forms.
#include <cmath>
#include <limits>

#include "bind.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "kiln/random.h"

namespace kiln::py {
namespace {

nb::tuple tensor_tuple(const std::vector<Tensor>& ts) {
  nb::list l;
  for (const Tensor& t : ts) l.append(nb::cast(t));
  return nb::tuple(l);
}

TensorOptions options_of(std::optional<DType> dtype, std::optional<Device> device, bool requires_grad, DType fallback) {
  return TensorOptions().dtype(dtype.value_or(fallback)).device(device.value_or(kCPU)).requires_grad(requires_grad);
}

// torch.norm's p: a number, inf, or "fro" (the 2-norm of the flattened dims).
double norm_order(nb::handle p) {
  if (p.is_none()) return 2.0;
  if (PyUnicode_Check(p.ptr())) {
    const std::string s = nb::cast<std::string>(p);
    if (s == "fro") return 2.0;
    throw nb::value_error(("norm: p='" + s + "' is not supported (use a number, inf, or 'fro')").c_str());
  }
  return nb::cast<double>(p);
}

// The bool mask of `idx` when it is a single bool tensor index.
std::optional<Tensor> bool_mask(nb::handle idx) {
  if (!nb::isinstance<Tensor>(idx)) return std::nullopt;
  Tensor m = nb::cast<Tensor>(idx);
  if (m.dtype() != kBool) return std::nullopt;
  return m;
}

void check_mask_shape(const Tensor& t, const Tensor& mask) {
  bool ok = mask.dim() <= t.dim();
  for (int64_t d = 0; ok && d < mask.dim(); ++d) ok = mask.sizes()[d] == t.sizes()[d];
  if (!ok)
    throw nb::index_error(("The shape of the mask " + shape_str(mask.sizes()) +
                           " does not match the shape of the indexed tensor " + shape_str(t.sizes())).c_str());
}

}  // namespace

std::optional<nb::object> getitem_by_mask(const Tensor& t, nb::handle idx) {
  auto mask = bool_mask(idx);
  if (!mask) return std::nullopt;
  check_mask_shape(t, *mask);
  return nb::cast(index_by_mask(t, *mask));
}

bool setitem_by_mask(const Tensor& t, nb::handle idx, nb::handle value) {
  auto mask = bool_mask(idx);
  if (!mask) return false;
  check_mask_shape(t, *mask);
  Tensor self = t;
  Tensor v;
  if (nb::isinstance<Tensor>(value)) {
    v = nb::cast<Tensor>(value);
  } else {
    double d;
    if (!nb::try_cast<double>(value, d)) throw nb::type_error("can only assign a Tensor or a Python number");
    v = full({}, d, TensorOptions(t.dtype()).device(t.device()));
  }
  index_put_by_mask_(self, *mask, v);
  return true;
}

void bind_tensor_ops(nb::module_& m) {
  // ---- reductions and statistics ----
  m.def("min", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) -> nb::object {
         if (!dim) return nb::cast(min(x));
         auto [v, i] = min(x, *dim, keepdim);
         return nb::make_tuple(v, i);
       }, "input"_a, "dim"_a = nb::none(), "keepdim"_a = false)
      .def("min", [](const Tensor& x, const Tensor& other) { return minimum(x, other); }, "input"_a, "other"_a)
      .def("argmin", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return argmin(x, dim, keepdim); },
           "input"_a, "dim"_a = nb::none(), "keepdim"_a = false);
  m.def("_var", [](const Tensor& x, nb::handle dim, double correction, bool keepdim) {
         return var(x, dims_from(dim, "var"), correction, keepdim);
       }, "input"_a, "dim"_a.none(), "correction"_a, "keepdim"_a)
      .def("_std", [](const Tensor& x, nb::handle dim, double correction, bool keepdim) {
             return std(x, dims_from(dim, "std"), correction, keepdim);
           }, "input"_a, "dim"_a.none(), "correction"_a, "keepdim"_a)
      .def("norm", [](const Tensor& x, nb::handle p, nb::handle dim, bool keepdim, std::optional<DType> dtype) {
             const Tensor in = dtype ? x.to(*dtype) : x;
             return norm(in, norm_order(p), dims_from(dim, "norm"), keepdim);
           }, "input"_a, "p"_a.none() = "fro", "dim"_a.none() = nb::none(), "keepdim"_a = false,
           "dtype"_a = nb::none(), "vector p-norm over dim (all dims by default); p = inf / -inf / 0 / 'fro' too");
  m.def("all", [](const Tensor& x, nb::handle dim, bool keepdim) { return all(x, dims_from(dim, "all"), keepdim); },
        "input"_a, "dim"_a.none() = nb::none(), "keepdim"_a = false)
      .def("any", [](const Tensor& x, nb::handle dim, bool keepdim) { return any(x, dims_from(dim, "any"), keepdim); },
           "input"_a, "dim"_a.none() = nb::none(), "keepdim"_a = false);

  // ---- splitting, sorting, einsum ----
  m.def("chunk", [](const Tensor& x, int64_t chunks, int64_t dim) { return tensor_tuple(chunk(x, chunks, dim)); },
        "input"_a, "chunks"_a, "dim"_a = 0)
      .def("split", [](const Tensor& x, int64_t size, int64_t dim) { return tensor_tuple(split(x, size, dim)); },
           "tensor"_a, "split_size_or_sections"_a, "dim"_a = 0)
      .def("split", [](const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
             return tensor_tuple(split(x, sizes, dim));
           }, "tensor"_a, "split_size_or_sections"_a, "dim"_a = 0)
      .def("unbind", [](const Tensor& x, int64_t dim) { return tensor_tuple(unbind(x, dim)); }, "input"_a, "dim"_a = 0)
      .def("_topk", [](const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
             return topk(x, k, dim, largest, sorted);
           }, "input"_a, "k"_a, "dim"_a, "largest"_a, "sorted"_a)
      .def("_sort", [](const Tensor& x, int64_t dim, bool descending) { return sort(x, dim, descending); },
           "input"_a, "dim"_a, "descending"_a)
      .def("argsort", [](const Tensor& x, int64_t dim, bool descending, bool) { return argsort(x, dim, descending); },
           "input"_a, "dim"_a = -1, "descending"_a = false, "stable"_a = false)
      .def("_einsum", [](const std::string& eq, const std::vector<Tensor>& ops) {
             nb::gil_scoped_release release;
             return einsum(eq, ops);
           }, "equation"_a, "operands"_a);

  // ---- masks and predicates ----
  m.def("masked_fill", [](const Tensor& x, const Tensor& mask, double v) { return masked_fill(x, mask, v); },
        "input"_a, "mask"_a, "value"_a)
      .def("masked_fill", [](const Tensor& x, const Tensor& mask, const Tensor& v) { return masked_fill(x, mask, v); },
           "input"_a, "mask"_a, "value"_a)
      .def("tril", &tril, "input"_a, "diagonal"_a = 0)
      .def("triu", &triu, "input"_a, "diagonal"_a = 0)
      .def("isnan", &isnan, "input"_a)
      .def("isinf", &isinf, "input"_a)
      .def("isfinite", &isfinite, "input"_a)
      .def("isclose", &isclose, "input"_a, "other"_a, "rtol"_a = 1e-5, "atol"_a = 1e-8, "equal_nan"_a = false)
      .def("allclose", &allclose, "input"_a, "other"_a, "rtol"_a = 1e-5, "atol"_a = 1e-8, "equal_nan"_a = false)
      .def("logical_and", &logical_and, "input"_a, "other"_a)
      .def("logical_or", &logical_or, "input"_a, "other"_a)
      .def("logical_xor", &logical_xor, "input"_a, "other"_a)
      .def("logical_not", &logical_not, "input"_a)
      .def("nonzero", [](const Tensor& x, bool as_tuple) -> nb::object {
             const Tensor nz = nonzero(x);
             if (!as_tuple) return nb::cast(nz);
             std::vector<Tensor> cols;
             for (int64_t d = 0; d < nz.size(1); ++d) cols.push_back(nz.select(1, d));
             return tensor_tuple(cols);
           }, "input"_a, nb::kw_only(), "as_tuple"_a = false)
      .def("masked_select", &masked_select, "input"_a, "mask"_a);

  // ---- in place (Tensor methods; self comes back) ----
  auto inplace = [](nb::handle self, auto&& f) {
    f(nb::cast<Tensor&>(self));
    return nb::borrow(self);
  };
  m.def("_sqrt_", [inplace](nb::handle s) { return inplace(s, [](Tensor& t) { sqrt_(t); }); })
      .def("_clamp_", [inplace](nb::handle s, std::optional<double> lo, std::optional<double> hi) {
             return inplace(s, [&](Tensor& t) { clamp_(t, lo, hi); });
           }, "self"_a, "min"_a.none(), "max"_a.none())
      .def("_addcmul_", [inplace](nb::handle s, const Tensor& a, const Tensor& b, double v) {
             return inplace(s, [&](Tensor& t) { addcmul_(t, a, b, v); });
           }, "self"_a, "tensor1"_a, "tensor2"_a, "value"_a)
      .def("_addcdiv_", [inplace](nb::handle s, const Tensor& a, const Tensor& b, double v) {
             return inplace(s, [&](Tensor& t) { addcdiv_(t, a, b, v); });
           }, "self"_a, "tensor1"_a, "tensor2"_a, "value"_a)
      .def("_lerp_", [inplace](nb::handle s, const Tensor& end, double w) {
             return inplace(s, [&](Tensor& t) { lerp_(t, end, w); });
           }, "self"_a, "end"_a, "weight"_a)
      .def("_lerp_", [inplace](nb::handle s, const Tensor& end, const Tensor& w) {
             return inplace(s, [&](Tensor& t) { lerp_(t, end, w); });
           }, "self"_a, "end"_a, "weight"_a)
      .def("_masked_fill_", [inplace](nb::handle s, const Tensor& mask, double v) {
             return inplace(s, [&](Tensor& t) { masked_fill_(t, mask, v); });
           }, "self"_a, "mask"_a, "value"_a)
      .def("_masked_fill_", [inplace](nb::handle s, const Tensor& mask, const Tensor& v) {
             KILN_CHECK(v.dim() == 0, "masked_fill_", "only supports a 0-d value tensor, got one with ", v.dim(), " dims");
             return inplace(s, [&](Tensor& t) { masked_fill_(t, mask, v.item()); });
           }, "self"_a, "mask"_a, "value"_a)
      .def("_set_data", [](Tensor& self, const Tensor& src) { set_data(self, src); }, "self"_a, "data"_a);

  // Scalar operands with alpha (t.add_(2.0, alpha=3), t.sub(1.0, alpha=2)): appended to the overloads
  // tensor_math.cpp binds, which take a tensor with alpha or a bare scalar.
  const nb::handle cls = nb::type<Tensor>();
  nb::cpp_function_def([inplace](nb::handle s, double o, double alpha) {
    return inplace(s, [&](Tensor& t) { add_(t, alpha * o); });
  }, nb::scope(cls), nb::name("add_"), nb::is_method(), "other"_a, "alpha"_a = 1.0);
  nb::cpp_function_def([inplace](nb::handle s, double o, double alpha) {
    return inplace(s, [&](Tensor& t) { add_(t, -alpha * o); });
  }, nb::scope(cls), nb::name("sub_"), nb::is_method(), "other"_a, "alpha"_a = 1.0);
  nb::cpp_function_def([](const Tensor& t, double o, double alpha) { return add(t, alpha * o); },
                       nb::scope(cls), nb::name("add"), nb::is_method(), "other"_a, "alpha"_a = 1.0);
  nb::cpp_function_def([](const Tensor& t, double o, double alpha) { return sub(t, alpha * o); },
                       nb::scope(cls), nb::name("sub"), nb::is_method(), "other"_a, "alpha"_a = 1.0);

  // ---- random: kiln.Generator and the functions that draw from one ----
  nb::class_<Generator>(m, "Generator",
                        "An independent Philox random stream (torch.Generator): pass it as generator= to "
                        "kiln.rand / randn / randint / multinomial / Tensor.normal_ / uniform_.")
      .def(nb::init<Device>(), "device"_a = Device(kCPU))
      .def("manual_seed", [](nb::handle self, nb::int_ seed) {
             // Any Python int, taken modulo 2^64 as torch does (manual_seed(-1) is allowed).
             const unsigned long long s = PyLong_AsUnsignedLongLongMask(seed.ptr());
             if (PyErr_Occurred()) throw nb::python_error();
             nb::cast<Generator&>(self).manual_seed(static_cast<uint64_t>(s));
             return nb::borrow(self);
           }, "seed"_a, "restarts the stream from `seed`; returns the generator")
      .def("seed", &Generator::seed, "reseeds from the OS; returns the seed")
      .def("initial_seed", &Generator::initial_seed)
      .def("__repr__", [](const Generator& g) { return "kiln.Generator(device='" + g.device().str() + "')"; })
      .def_prop_ro("device", &Generator::device)
      .def("get_state", &Generator::get_state, "int64 [2] tensor {seed, offset}")
      .def("set_state", [](nb::handle self, const Tensor& s) {
             nb::cast<Generator&>(self).set_state(s);
             return nb::borrow(self);
           }, "new_state"_a);
  m.def("_rand_gen", [](const Shape& shape, const Generator& g, std::optional<DType> dtype, std::optional<Device> device,
                        bool requires_grad) { return rand(shape, g, options_of(dtype, device, requires_grad, kFloat32)); },
        "size"_a, "generator"_a, "dtype"_a.none(), "device"_a.none(), "requires_grad"_a)
      .def("_randn_gen", [](const Shape& shape, const Generator& g, std::optional<DType> dtype,
                            std::optional<Device> device, bool requires_grad) {
             return randn(shape, g, options_of(dtype, device, requires_grad, kFloat32));
           }, "size"_a, "generator"_a, "dtype"_a.none(), "device"_a.none(), "requires_grad"_a)
      .def("_randint_gen", [](int64_t low, int64_t high, const Shape& shape, const Generator& g,
                              std::optional<DType> dtype, std::optional<Device> device) {
             return randint(low, high, shape, g, options_of(dtype, device, false, kInt64));
           }, "low"_a, "high"_a, "size"_a, "generator"_a, "dtype"_a.none(), "device"_a.none())
      .def("_normal_", [inplace](nb::handle s, double mean, double stddev, const Generator* g) {
             return inplace(s, [&](Tensor& t) { normal_(t, mean, stddev, g); });
           }, "self"_a, "mean"_a, "std"_a, "generator"_a.none())
      .def("_uniform_", [inplace](nb::handle s, double from, double to, const Generator* g) {
             return inplace(s, [&](Tensor& t) { uniform_(t, from, to, g); });
           }, "self"_a, "from_"_a, "to"_a, "generator"_a.none())
      .def("_randperm", [](int64_t n, const Generator* g, std::optional<DType> dtype, std::optional<Device> device) {
             return randperm(n, g, options_of(dtype, device, false, kInt64));
           }, "n"_a, "generator"_a.none(), "dtype"_a.none(), "device"_a.none())
      .def("multinomial", [](const Tensor& probs, int64_t n, bool replacement, const Generator* g) {
             return multinomial(probs, n, replacement, g);
           }, "input"_a, "num_samples"_a, "replacement"_a = false, nb::kw_only(), "generator"_a.none() = nb::none());
}

}  // namespace kiln::py
