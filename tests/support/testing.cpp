#include "support/testing.h"

#include <cmath>
#include <sstream>

namespace kiln::testing {

double rel_error(const Tensor& out, const Tensor& ref) {
  if (out.sizes() != ref.sizes()) {
    ADD_FAILURE() << "shape mismatch: " << shape_str(out.sizes()) << " vs " << shape_str(ref.sizes());
    return INFINITY;
  }
  const std::vector<double> a = out.to_vector(), b = ref.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && !(std::isinf(b[i]) && a[i] == b[i])) return INFINITY;
    if (std::isinf(b[i])) continue;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

double tolerance(DType dtype) {
  switch (dtype) {
    case kFloat64: return 1e-12;
    case kFloat32: return 1e-5;
    case kFloat16: return 3e-3;
    case kBFloat16: return 1e-2;
    default: return 0;
  }
}

bool has_cuda() {
  static const bool available = cuda_is_available();
  return available;
}

void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                      double eps, double tol) {
  Tensor out = f(inputs);
  ASSERT_TRUE(out.requires_grad()) << "gradcheck: output does not require grad";
  Tensor cot = randn(out.sizes(), TensorOptions().dtype(kFloat64));
  std::vector<Tensor> wrt;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) wrt.push_back(t);
  const std::vector<Tensor> analytic = autograd::grad({out}, wrt, {cot});
  const std::vector<double> c = cot.to_vector();

  auto project = [&](const std::vector<Tensor>& in) {
    NoGradGuard no_grad;
    const std::vector<double> o = f(in).to_vector();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * c[i];
    return s;
  };

  size_t k = 0;
  for (size_t idx = 0; idx < inputs.size(); ++idx) {
    const Tensor& t = inputs[idx];
    if (!t.defined() || !t.requires_grad()) continue;
    ASSERT_EQ(t.dtype(), kFloat64) << "gradcheck needs float64 inputs";
    const Tensor g = analytic[k++];
    const std::vector<double> ga = g.defined() ? g.to_vector() : std::vector<double>(t.numel(), 0.0);
    std::vector<double> numeric(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) {
      std::vector<Tensor> in = inputs;
      Tensor plus = t.detach().clone(), minus = t.detach().clone();
      plus.data_ptr<double>()[i] += eps;  // inputs are CPU float64 contiguous clones
      minus.data_ptr<double>()[i] -= eps;
      in[idx] = plus;
      const double fp = project(in);
      in[idx] = minus;
      const double fm = project(in);
      numeric[i] = (fp - fm) / (2 * eps);
    }
    double num = 0, den = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      num += (ga[i] - numeric[i]) * (ga[i] - numeric[i]);
      den += numeric[i] * numeric[i];
    }
    const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    EXPECT_LE(err, tol) << "gradcheck: input " << idx << " analytic vs numeric relative error " << err;
  }
}

void expect_cuda_matches_cpu(const std::string& name, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs, double tol) {
  SCOPED_TRACE("backend op: " + name);
  std::vector<Tensor> cpu_in, cuda_in;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      cpu_in.emplace_back();
      cuda_in.emplace_back();
      continue;
    }
    Tensor c = t.detach().clone();
    Tensor g = t.detach().to(Device("cuda"));
    if (t.requires_grad()) {
      c.requires_grad_(true);
      g.requires_grad_(true);
    }
    cpu_in.push_back(c);
    cuda_in.push_back(g);
  }
  Tensor out_cpu = f(cpu_in);
  Tensor out_cuda = f(cuda_in);
  ASSERT_TRUE(out_cuda.is_cuda()) << name << ": output of the CUDA run is on " << out_cuda.device();
  ASSERT_EQ(out_cpu.dtype(), out_cuda.dtype());
  const double t = tol >= 0 ? tol : std::max(tolerance(out_cpu.dtype()), 1e-6);
  if (is_floating_point(out_cpu.dtype())) {
    EXPECT_CLOSE(out_cuda, out_cpu, t);
  } else {
    EXPECT_EQ(out_cuda.to_vector(), out_cpu.to_vector()) << name << ": integer outputs differ";
  }
  if (!out_cpu.requires_grad()) return;
  Tensor cot = randn(out_cpu.sizes(), TensorOptions().dtype(out_cpu.dtype()));
  out_cpu.backward(cot);
  out_cuda.backward(cot.to(Device("cuda")));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu_in[i].defined() || !cpu_in[i].requires_grad()) continue;
    SCOPED_TRACE("gradient of input " + std::to_string(i));
    ASSERT_TRUE(cuda_in[i].grad().defined());
    EXPECT_CLOSE(cuda_in[i].grad(), cpu_in[i].grad(), t);
  }
}

}  // namespace kiln::testing
