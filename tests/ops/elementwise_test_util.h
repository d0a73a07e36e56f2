#pragma once
// Shared pieces of the elementwise tests: the op tables and float64 references by plain loops.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/testing.h"

namespace kiln::testing::ew {

inline const std::vector<DType> kFloatTypes = {kFloat32, kBFloat16, kFloat16, kFloat64};

// Applies f elementwise in float64 over the (already broadcast) values of the inputs.
inline Tensor ref_map(const std::vector<Tensor>& ins, const std::function<double(const std::vector<double>&)>& f) {
  Shape shape = ins[0].sizes();
  for (const Tensor& t : ins) shape = broadcast_shapes(shape, t.sizes());
  std::vector<std::vector<double>> vals;
  for (const Tensor& t : ins) vals.push_back(t.detach().expand(shape).to_vector());
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  std::vector<double> args(ins.size());
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t k = 0; k < ins.size(); ++k) args[k] = vals[k][i];
    out[i] = f(args);
  }
  return tensor(out, kFloat64).reshape(shape);
}

inline double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  bool positive;  // domain needs x > 0
};

inline std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, false},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, false},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, true},
      {"erf", [](const Tensor& x) { return erf(x); }, [](double x) { return std::erf(x); }, false},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, false},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, true},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }, true},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, false},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_ref, false},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; }, false},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sigmoid_ref(x); }, false},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref, false},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, gelu_tanh_ref, false},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); },
       [](double x) { return std::min(std::max(x, -0.5), 0.75); }, false},
      {"clamp_min", [](const Tensor& x) { return clamp(x, 0.25, std::nullopt); },
       [](double x) { return std::max(x, 0.25); }, false},
      {"scalar_add", [](const Tensor& x) { return x + 1.5; }, [](double x) { return x + 1.5; }, false},
      {"scalar_sub", [](const Tensor& x) { return x - 0.75; }, [](double x) { return x - 0.75; }, false},
      {"scalar_mul", [](const Tensor& x) { return 3.0 * x; }, [](double x) { return 3.0 * x; }, false},
      {"scalar_div", [](const Tensor& x) { return x / 4.0; }, [](double x) { return x / 4.0; }, false},
      {"scalar_pow", [](const Tensor& x) { return pow(x, 1.5); }, [](double x) { return std::pow(x, 1.5); }, true},
      {"scalar_pow2", [](const Tensor& x) { return pow(x, 2.0); }, [](double x) { return x * x; }, false},
      {"rsub", [](const Tensor& x) { return 2.0 - x; }, [](double x) { return 2.0 - x; }, false},
      {"rdiv", [](const Tensor& x) { return 2.0 / x; }, [](double x) { return 2.0 / x; }, true},
  };
}

struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  bool positive_a;    // a > 0 (pow)
  bool nonzero_b;     // b away from 0 (div)
};

inline std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, false, false},
      {"add_alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); },
       [](double a, double b) { return a + 2.5 * b; }, false, false},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, false, false},
      {"sub_alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 0.5); },
       [](double a, double b) { return a - 0.5 * b; }, false, false},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, false, false},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; },
       false, true},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double a, double b) { return std::pow(a, b); }, true, false},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, false, false},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, false, false},
  };
}

// Fresh random inputs in the op's domain: positive in [0.5, 2), or |b| in [0.5, 2.5) with a sign.
inline Tensor make_input(const Shape& shape, DType dtype, bool positive, bool nonzero) {
  NoGradGuard no_grad;
  if (positive) return add(mul(rand(shape, kFloat64), 1.5), 0.5).to(dtype);
  if (nonzero) {
    const Tensor mag = add(mul(rand(shape, kFloat64), 2.0), 0.5);
    const Tensor sign = sub(mul(gt(rand(shape, kFloat64), 0.5).to(kFloat64), 2.0), 1.0);
    return mul(mag, sign).to(dtype);
  }
  return randn(shape, dtype);
}

}  // namespace kiln::testing::ew
