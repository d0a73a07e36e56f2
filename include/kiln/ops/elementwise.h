#pragma once
// Elementwise ops with broadcasting (NumPy rules). Binary ops compute in the promoted dtype of
// their operands (promote_types), 16-bit floats in fp32 internally; outputs take the promoted
// dtype. A double operand is a scalar of the tensor's dtype (it never promotes bf16 to fp32).
// Shapes: a, b broadcastable -> broadcast(a.sizes(), b.sizes()).
// A 0-d tensor does not widen a dimensioned one of the same kind (bf16 [N] + f32 [] -> bf16), and a
// 0-d CPU tensor may meet a CUDA tensor (as in PyTorch). Integer division is true division (f32);
// float-only unary ops (exp, log, tanh, sqrt, rsqrt, sigmoid, silu, gelu) read integers as f32.
// Arithmetic on bool tensors raises. Every differentiable op records autograd; its backward is
// itself differentiable (create_graph) and uses fused kernels otherwise.
#include <optional>
#include <string>

#include "kiln/tensor.h"

namespace kiln {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);
// approximate: "none" (erf) or "tanh", as in torch.nn.functional.gelu.
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

// condition: bool, broadcastable with a and b.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);

// Comparisons -> bool tensors (not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

// In place (not differentiable; for optimizers and buffers under NoGradGuard). other must
// broadcast to self's shape; the result is computed in the promoted dtype and stored in self's.
// Like Tensor::copy_, they raise on a leaf that requires grad while grad mode is on.
Tensor& add_(Tensor& self, const Tensor& other, double alpha = 1.0);  // self += alpha * other
Tensor& sub_(Tensor& self, const Tensor& other, double alpha = 1.0);  // self -= alpha * other
Tensor& mul_(Tensor& self, const Tensor& other);
Tensor& div_(Tensor& self, const Tensor& other);
Tensor& add_(Tensor& self, double value);
Tensor& mul_(Tensor& self, double value);
Tensor& div_(Tensor& self, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);  // a - b
Tensor operator/(double a, const Tensor& b);  // a / b

}  // namespace kiln
