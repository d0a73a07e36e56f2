#pragma once
// Elementwise ops with broadcasting (NumPy rules). Binary ops compute in result_type(a, b) (PyTorch's
// type promotion), 16-bit floats in fp32 internally, and return that dtype.
// Shapes: a, b broadcastable -> broadcast(a.sizes(), b.sizes()).
// Promotion: categories bool < integer < floating. Two tensors of the same dimensionality meet in
// promote_types; a 0-d tensor widens a dimensioned one only when its category is higher
// (bf16 [N] + f32 [] -> bf16, int32 [N] + f64 [] -> f64); a Scalar (a number) only when its
// category is higher, and then to that category's default dtype (int64 [N] * 0.1 -> f32, bool [N] + 1
// -> int64, int32 [N] * 2 -> int32). A 0-d CPU tensor may meet a CUDA tensor (as in PyTorch).
// div is true division (integer and bool results become f32); sub refuses bool operands; add, mul,
// maximum and minimum of bools give bools (or, and, or, and); pow of two bool tensors raises.
// Float-only unary ops (exp, log, tanh, sqrt, rsqrt, sigmoid, silu, gelu) read integers as f32.
// Every differentiable op records autograd; its backward is itself differentiable (create_graph)
// and uses fused kernels otherwise.
#include <optional>
#include <string>

#include "kiln/scalar.h"
#include "kiln/tensor.h"

namespace kiln {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");

// The dtype a binary op on these operands computes in (torch.result_type).
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor pow(const Tensor& a, Scalar exponent);
Tensor sub(Scalar a, const Tensor& b);       // a - b
Tensor div(Scalar a, const Tensor& b);       // a / b
Tensor pow(Scalar self, const Tensor& exponent);  // self ** exponent

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
Tensor where(const Tensor& condition, const Tensor& a, Scalar b);
Tensor where(const Tensor& condition, Scalar a, const Tensor& b);

// Comparisons -> bool tensors (not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);

// In place (not differentiable; for optimizers and buffers under NoGradGuard). other must
// broadcast to self's shape; the result is computed in the promoted dtype and stored in self's,
// which must hold it (an int tensor += 0.5 raises, as in PyTorch).
// Like Tensor::copy_, they raise on a leaf that requires grad while grad mode is on.
Tensor& add_(Tensor& self, const Tensor& other, double alpha = 1.0);  // self += alpha * other
Tensor& sub_(Tensor& self, const Tensor& other, double alpha = 1.0);  // self -= alpha * other
Tensor& mul_(Tensor& self, const Tensor& other);
Tensor& div_(Tensor& self, const Tensor& other);
Tensor& add_(Tensor& self, Scalar value);
Tensor& sub_(Tensor& self, Scalar value);
Tensor& mul_(Tensor& self, Scalar value);
Tensor& div_(Tensor& self, Scalar value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);  // a - b
Tensor operator/(Scalar a, const Tensor& b);  // a / b

}  // namespace kiln
