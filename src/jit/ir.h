#pragma once
// A small IR for element-wise and row-reduction work: expressions over the inputs of one kernel,
// printed as CUDA C++ for kiln::jit (fp32 arithmetic, inputs and outputs of one storage type) and
// evaluated in float64 on the host, the reference the fused CPU kernels are tested against.
//
//   Expr g = arg(0), u = arg(1);
//   Pointwise swiglu{"swiglu_fwd", 2, {silu(g) * u}};
//   std::string src = cuda_source(swiglu, "float");     // out0[i] = silu(in0[i]) * in1[i]
#include <memory>
#include <string>
#include <vector>

namespace kiln::jit {

enum class Op { arg, constant, add, sub, mul, div, neg, exp, log, sqrt, rsqrt, sigmoid, silu, tanh, max, min };

struct Node;
class Expr {
 public:
  Expr(double value);  // a constant
  explicit Expr(std::shared_ptr<const Node> node) : node_(std::move(node)) {}
  const Node& node() const { return *node_; }

 private:
  std::shared_ptr<const Node> node_;
};

struct Node {
  Op op;
  int index = 0;       // Op::arg: which input
  double value = 0.0;  // Op::constant
  std::vector<Expr> operands;
};

Expr arg(int index);
Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator*(const Expr& a, const Expr& b);
Expr operator/(const Expr& a, const Expr& b);
Expr operator-(const Expr& a);
Expr exp(const Expr& a);
Expr log(const Expr& a);
Expr sqrt(const Expr& a);
Expr rsqrt(const Expr& a);
Expr sigmoid(const Expr& a);
Expr silu(const Expr& a);
Expr tanh(const Expr& a);
Expr max(const Expr& a, const Expr& b);
Expr min(const Expr& a, const Expr& b);

// out_j[i] = outputs[j](in_0[i], ..., in_{n-1}[i]) over n elements.
struct Pointwise {
  std::string name;
  int inputs = 0;
  std::vector<Expr> outputs;
};

// out[r] = sum over c of term(in_0[r, c], ..., in_{n-1}[r, c]) for row-major [rows, cols] inputs.
struct RowSum {
  std::string name;
  int inputs = 0;
  Expr term = Expr(0.0);
};

// CUDA C++: extern "C" __global__ void <name>(const T* in0, ..., T* out0, ..., long long n) (a grid
// stride loop), or for a RowSum <name>(const T* in0, ..., float* out, long long rows, long long cols)
// (one block a row, a shared-memory tree; launch with 256 threads). `type` is T's CUDA name
// ("float", "__nv_bfloat16"); arithmetic is fp32.
std::string cuda_source(const Pointwise& k, const std::string& type);
std::string cuda_source(const RowSum& k, const std::string& type);

// The expression in float64 at one element (args[i] = input i).
double evaluate(const Expr& e, const std::vector<double>& args);

}  // namespace kiln::jit
