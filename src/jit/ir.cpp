// The element-wise / row-reduction IR (ir.h): construction, CUDA printing, float64 evaluation.
#include "jit/ir.h"

#include <cmath>
#include <sstream>

#include "kiln/error.h"

namespace kiln::jit {
namespace {

constexpr const char* kOp = "jit";

Expr make(Op op, std::vector<Expr> operands) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->operands = std::move(operands);
  return Expr(std::move(n));
}

// The largest argument index + 1, checked against the kernel's input count.
int arity(const Expr& e) {
  const Node& n = e.node();
  int a = n.op == Op::arg ? n.index + 1 : 0;
  for (const Expr& o : n.operands) a = std::max(a, arity(o));
  return a;
}

std::string print(const Expr& e) {
  const Node& n = e.node();
  auto operand = [&](size_t i) { return print(n.operands[i]); };
  switch (n.op) {
    case Op::arg: return "a" + std::to_string(n.index);
    case Op::constant: {
      std::ostringstream os;
      os.precision(9);
      os << std::showpoint << static_cast<float>(n.value) << "f";
      return "(" + os.str() + ")";
    }
    case Op::add: return "(" + operand(0) + " + " + operand(1) + ")";
    case Op::sub: return "(" + operand(0) + " - " + operand(1) + ")";
    case Op::mul: return "(" + operand(0) + " * " + operand(1) + ")";
    case Op::div: return "(" + operand(0) + " / " + operand(1) + ")";
    case Op::neg: return "(-" + operand(0) + ")";
    case Op::exp: return "__expf(" + operand(0) + ")";
    case Op::log: return "__logf(" + operand(0) + ")";
    case Op::sqrt: return "sqrtf(" + operand(0) + ")";
    case Op::rsqrt: return "rsqrtf(" + operand(0) + ")";
    case Op::sigmoid: return "(1.0f / (1.0f + __expf(-" + operand(0) + ")))";
    case Op::silu: return "kiln_silu(" + operand(0) + ")";
    case Op::tanh: return "tanhf(" + operand(0) + ")";
    case Op::max: return "fmaxf(" + operand(0) + ", " + operand(1) + ")";
    case Op::min: return "fminf(" + operand(0) + ", " + operand(1) + ")";
  }
  return "";
}

std::string prelude(const std::string& type) {
  std::string s;
  if (type == "__nv_bfloat16") s += "#include <cuda_bf16.h>\n";
  if (type == "__half") s += "#include <cuda_fp16.h>\n";
  s += "__device__ __forceinline__ float kiln_silu(float x) { return x / (1.0f + __expf(-x)); }\n";
  return s;
}

std::string inputs_signature(int inputs, const std::string& type) {
  std::string s;
  for (int i = 0; i < inputs; ++i) s += "const " + type + "* __restrict__ in" + std::to_string(i) + ", ";
  return s;
}

std::string loads(int inputs, const std::string& index) {
  std::string s;
  for (int i = 0; i < inputs; ++i)
    s += "    const float a" + std::to_string(i) + " = static_cast<float>(in" + std::to_string(i) + "[" + index + "]);\n";
  return s;
}

void check_arity(const std::string& name, int inputs, const Expr& e) {
  KILN_CHECK(arity(e) <= inputs, kOp, "kernel '", name, "' reads input ", arity(e) - 1, " but has ", inputs);
}

}  // namespace

Expr::Expr(double value) {
  auto n = std::make_shared<Node>();
  n->op = Op::constant;
  n->value = value;
  node_ = std::move(n);
}

Expr arg(int index) {
  KILN_CHECK(index >= 0, kOp, "argument index must be >= 0, got ", index);
  auto n = std::make_shared<Node>();
  n->op = Op::arg;
  n->index = index;
  return Expr(std::move(n));
}

Expr operator+(const Expr& a, const Expr& b) { return make(Op::add, {a, b}); }
Expr operator-(const Expr& a, const Expr& b) { return make(Op::sub, {a, b}); }
Expr operator*(const Expr& a, const Expr& b) { return make(Op::mul, {a, b}); }
Expr operator/(const Expr& a, const Expr& b) { return make(Op::div, {a, b}); }
Expr operator-(const Expr& a) { return make(Op::neg, {a}); }
Expr exp(const Expr& a) { return make(Op::exp, {a}); }
Expr log(const Expr& a) { return make(Op::log, {a}); }
Expr sqrt(const Expr& a) { return make(Op::sqrt, {a}); }
Expr rsqrt(const Expr& a) { return make(Op::rsqrt, {a}); }
Expr sigmoid(const Expr& a) { return make(Op::sigmoid, {a}); }
Expr silu(const Expr& a) { return make(Op::silu, {a}); }
Expr tanh(const Expr& a) { return make(Op::tanh, {a}); }
Expr max(const Expr& a, const Expr& b) { return make(Op::max, {a, b}); }
Expr min(const Expr& a, const Expr& b) { return make(Op::min, {a, b}); }

std::string cuda_source(const Pointwise& k, const std::string& type) {
  KILN_CHECK(!k.outputs.empty(), kOp, "kernel '", k.name, "' has no outputs");
  for (const Expr& e : k.outputs) check_arity(k.name, k.inputs, e);
  std::string s = prelude(type) + "extern \"C\" __global__ void " + k.name + "(" + inputs_signature(k.inputs, type);
  for (size_t j = 0; j < k.outputs.size(); ++j) s += type + "* __restrict__ out" + std::to_string(j) + ", ";
  s += "long long n) {\n  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
       "       i += (long long)gridDim.x * blockDim.x) {\n" + loads(k.inputs, "i");
  for (size_t j = 0; j < k.outputs.size(); ++j)
    s += "    out" + std::to_string(j) + "[i] = static_cast<" + type + ">(" + print(k.outputs[j]) + ");\n";
  return s + "  }\n}\n";
}

std::string cuda_source(const RowSum& k, const std::string& type) {
  check_arity(k.name, k.inputs, k.term);
  return prelude(type) + "extern \"C\" __global__ void __launch_bounds__(256) " + k.name + "(" +
         inputs_signature(k.inputs, type) +
         "float* __restrict__ out, long long rows, long long cols) {\n"
         "  __shared__ float part[256];\n"
         "  const long long r = blockIdx.x;\n"
         "  if (r >= rows) return;\n"
         "  float acc = 0.0f;\n"
         "  for (long long c = threadIdx.x; c < cols; c += 256) {\n"
         "    const long long i = r * cols + c;\n" +
         loads(k.inputs, "i") + "    acc += " + print(k.term) +
         ";\n  }\n"
         "  part[threadIdx.x] = acc;\n"
         "  __syncthreads();\n"
         "  for (int s = 128; s > 0; s >>= 1) {\n"
         "    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];\n"
         "    __syncthreads();\n"
         "  }\n"
         "  if (threadIdx.x == 0) out[r] = part[0];\n"
         "}\n";
}

double evaluate(const Expr& e, const std::vector<double>& args) {
  const Node& n = e.node();
  auto v = [&](size_t i) { return evaluate(n.operands[i], args); };
  switch (n.op) {
    case Op::arg:
      KILN_CHECK(static_cast<size_t>(n.index) < args.size(), kOp, "argument ", n.index, " of ", args.size());
      return args[static_cast<size_t>(n.index)];
    case Op::constant: return n.value;
    case Op::add: return v(0) + v(1);
    case Op::sub: return v(0) - v(1);
    case Op::mul: return v(0) * v(1);
    case Op::div: return v(0) / v(1);
    case Op::neg: return -v(0);
    case Op::exp: return std::exp(v(0));
    case Op::log: return std::log(v(0));
    case Op::sqrt: return std::sqrt(v(0));
    case Op::rsqrt: return 1.0 / std::sqrt(v(0));
    case Op::sigmoid: return 1.0 / (1.0 + std::exp(-v(0)));
    case Op::silu: {
      const double x = v(0);
      return x / (1.0 + std::exp(-x));
    }
    case Op::tanh: return std::tanh(v(0));
    case Op::max: return std::max(v(0), v(1));
    case Op::min: return std::min(v(0), v(1));
  }
  return 0.0;
}

}  // namespace kiln::jit
