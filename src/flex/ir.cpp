// The mod IR: building expressions (kind checks, int -> float promotion made explicit as ToFloat
// nodes), printing them, and compiling them into a flat program.
#include "flex/ir.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <sstream>
#include <unordered_map>

#include "core/tensor_impl.h"

namespace kiln::flex {
namespace {

using NodePtr = std::shared_ptr<const ExprNode>;

Expr make(Op op, Kind kind, std::vector<NodePtr> args) {
  auto n = std::make_shared<ExprNode>();
  n->op = op;
  n->kind = kind;
  n->args = std::move(args);
  return Expr(NodePtr(n));
}

Expr leaf(Op op, Kind kind) {
  static thread_local std::unordered_map<int, NodePtr> cache;  // leaves are shared singletons
  auto& slot = cache[static_cast<int>(op)];
  if (!slot) slot = make(op, kind, {}).node();
  return Expr(slot);
}

void check_complete(const Expr& e, const char* what) {
  const ExprNode& n = *e.node();
  if (n.op == Op::Load)
    KILN_CHECK(static_cast<int64_t>(n.args.size()) == n.tensor->tensor.dim(), "flex", what,
               ": a load from a ", n.tensor->tensor.dim(), "-d captured tensor needs ", n.tensor->tensor.dim(),
               " indices, got ", n.args.size());
}

const char* kind_name(Kind k) { return k == Kind::Int ? "int" : k == Kind::Float ? "float" : "bool"; }

Expr promote(const Expr& e) {
  if (e.kind() == Kind::Float) return e;
  KILN_CHECK(e.kind() == Kind::Int, "flex", "expected a number, got a bool expression");
  return make(Op::ToFloat, Kind::Float, {e.node()});
}

// Arithmetic on two numbers: ints stay ints, anything with a float becomes float.
Expr arith(Op op, const Expr& x, const Expr& y, const char* sym) {
  check_complete(x, sym);
  check_complete(y, sym);
  KILN_CHECK(x.kind() != Kind::Bool && y.kind() != Kind::Bool, "flex", "operator ", sym,
             " needs numbers, got ", kind_name(x.kind()), " and ", kind_name(y.kind()));
  if (x.kind() == Kind::Int && y.kind() == Kind::Int) return make(op, Kind::Int, {x.node(), y.node()});
  if (op == Op::Mod) {  // Python's and torch.remainder's float modulo: the sign of the divisor
    const Expr fx = promote(x), fy = promote(y);
    return fx - floor(fx / fy) * fy;
  }
  return make(op, Kind::Float, {promote(x).node(), promote(y).node()});
}

Expr compare(Op op, const Expr& x, const Expr& y, const char* sym) {
  check_complete(x, sym);
  check_complete(y, sym);
  if (x.kind() == Kind::Bool || y.kind() == Kind::Bool) {
    KILN_CHECK(x.kind() == y.kind() && (op == Op::Eq || op == Op::Ne), "flex", "operator ", sym, " cannot compare ",
               kind_name(x.kind()), " and ", kind_name(y.kind()));
    return make(op, Kind::Bool, {x.node(), y.node()});
  }
  if (x.kind() == Kind::Int && y.kind() == Kind::Int) return make(op, Kind::Bool, {x.node(), y.node()});
  return make(op, Kind::Bool, {promote(x).node(), promote(y).node()});
}

Expr logical(Op op, const Expr& x, const Expr& y, const char* sym) {
  check_complete(x, sym);
  check_complete(y, sym);
  KILN_CHECK(x.kind() == Kind::Bool && y.kind() == Kind::Bool, "flex", "operator ", sym, " needs bools, got ",
             kind_name(x.kind()), " and ", kind_name(y.kind()));
  return make(op, Kind::Bool, {x.node(), y.node()});
}

Expr unary_float(Op op, const Expr& x, const char* name) {
  check_complete(x, name);
  return make(op, Kind::Float, {promote(x).node()});
}

bool any_node(const NodePtr& n, const std::function<bool(const ExprNode&)>& pred) {
  if (pred(*n)) return true;
  for (const NodePtr& a : n->args)
    if (any_node(a, pred)) return true;
  return false;
}

}  // namespace

Expr::Expr() : Expr(int64_t{0}) {}
Expr::Expr(int v) : Expr(static_cast<int64_t>(v)) {}
Expr::Expr(int64_t v) {
  auto n = std::make_shared<ExprNode>();
  n->op = Op::ConstInt;
  n->kind = Kind::Int;
  n->ival = v;
  node_ = n;
}
Expr::Expr(double v) {
  auto n = std::make_shared<ExprNode>();
  n->op = Op::ConstFloat;
  n->kind = Kind::Float;
  n->fval = v;
  node_ = n;
}
Expr::Expr(bool v) {
  auto n = std::make_shared<ExprNode>();
  n->op = Op::ConstBool;
  n->kind = Kind::Bool;
  n->ival = v ? 1 : 0;
  node_ = n;
}

Expr Expr::operator[](const Expr& index) const {
  KILN_CHECK(node_->op == Op::Load, "flex", "only captured tensors can be indexed");
  const int64_t dim = node_->tensor->tensor.dim();
  KILN_CHECK(static_cast<int64_t>(node_->args.size()) < dim, "flex", "too many indices for a ", dim,
             "-d captured tensor");
  KILN_CHECK(index.kind() == Kind::Int, "flex", "a captured tensor index must be an int expression, got ",
             kind_name(index.kind()));
  check_complete(index, "index");
  auto n = std::make_shared<ExprNode>(*node_);
  n->args.push_back(index.node());
  if (static_cast<int64_t>(n->args.size()) == dim) n->kind = n->tensor->kind;
  return Expr(NodePtr(n));
}

bool Expr::reads_tensors() const {
  return any_node(node_, [](const ExprNode& n) { return n.op == Op::Load; });
}
std::vector<Tensor> captured_tensors(const Expr& e) {
  std::vector<const CapturedTensor*> seen;
  std::vector<Tensor> out;
  any_node(e.node(), [&](const ExprNode& n) {
    if (n.op == Op::Load && n.tensor && std::find(seen.begin(), seen.end(), n.tensor.get()) == seen.end()) {
      seen.push_back(n.tensor.get());
      out.push_back(n.tensor->tensor);
    }
    return false;  // visit every node
  });
  return out;
}
bool Expr::uses_b() const {
  return any_node(node_, [](const ExprNode& n) { return n.op == Op::B; });
}
bool Expr::uses_h() const {
  return any_node(node_, [](const ExprNode& n) { return n.op == Op::H; });
}

Expr score() { return leaf(Op::Score, Kind::Float); }
Expr b() { return leaf(Op::B, Kind::Int); }
Expr h() { return leaf(Op::H, Kind::Int); }
Expr q_idx() { return leaf(Op::QIdx, Kind::Int); }
Expr kv_idx() { return leaf(Op::KvIdx, Kind::Int); }

Captured::Captured(const Tensor& t) {
  KILN_CHECK(t.defined(), "capture", "undefined tensor");
  KILN_CHECK(t.dim() >= 1 && t.dim() <= 3, "capture", "captured tensors are 1-d to 3-d, got shape ",
             shape_str(t.sizes()));
  KILN_CHECK(!t.is_cuda(), "capture", "captured tensors must be on the CPU for now");
  data_ = std::make_shared<CapturedTensor>();
  data_->tensor = t;
  data_->kind = t.dtype() == kBool ? Kind::Bool : is_floating_point(t.dtype()) ? Kind::Float : Kind::Int;
}

Expr Captured::operator[](const Expr& index) const {
  KILN_CHECK(data_ != nullptr, "flex", "indexing an empty Captured");
  auto n = std::make_shared<ExprNode>();
  n->op = Op::Load;
  n->kind = data_->kind;
  n->tensor = data_;
  return Expr(NodePtr(n))[index];
}

const Tensor& Captured::tensor() const { return data_->tensor; }
Captured capture(const Tensor& t) { return Captured(t); }

Expr operator+(const Expr& x, const Expr& y) { return arith(Op::Add, x, y, "+"); }
Expr operator-(const Expr& x, const Expr& y) { return arith(Op::Sub, x, y, "-"); }
Expr operator*(const Expr& x, const Expr& y) { return arith(Op::Mul, x, y, "*"); }
Expr operator/(const Expr& x, const Expr& y) { return arith(Op::Div, x, y, "/"); }
Expr operator%(const Expr& x, const Expr& y) { return arith(Op::Mod, x, y, "%"); }
Expr operator-(const Expr& x) {
  check_complete(x, "-");
  KILN_CHECK(x.kind() != Kind::Bool, "flex", "unary - needs a number");
  return make(Op::Neg, x.kind(), {x.node()});
}
Expr operator<(const Expr& x, const Expr& y) { return compare(Op::Lt, x, y, "<"); }
Expr operator<=(const Expr& x, const Expr& y) { return compare(Op::Le, x, y, "<="); }
Expr operator>(const Expr& x, const Expr& y) { return compare(Op::Gt, x, y, ">"); }
Expr operator>=(const Expr& x, const Expr& y) { return compare(Op::Ge, x, y, ">="); }
Expr operator==(const Expr& x, const Expr& y) { return compare(Op::Eq, x, y, "=="); }
Expr operator!=(const Expr& x, const Expr& y) { return compare(Op::Ne, x, y, "!="); }
Expr operator&(const Expr& x, const Expr& y) { return logical(Op::And, x, y, "&"); }
Expr operator|(const Expr& x, const Expr& y) { return logical(Op::Or, x, y, "|"); }
Expr operator!(const Expr& x) {
  check_complete(x, "!");
  KILN_CHECK(x.kind() == Kind::Bool, "flex", "operator ! needs a bool, got ", kind_name(x.kind()));
  return make(Op::Not, Kind::Bool, {x.node()});
}
Expr where(const Expr& c, const Expr& x, const Expr& y) {
  check_complete(c, "where");
  check_complete(x, "where");
  check_complete(y, "where");
  KILN_CHECK(c.kind() == Kind::Bool, "flex", "where needs a bool condition, got ", kind_name(c.kind()));
  if (x.kind() == y.kind()) return make(Op::Where, x.kind(), {c.node(), x.node(), y.node()});
  return make(Op::Where, Kind::Float, {c.node(), promote(x).node(), promote(y).node()});
}
Expr min(const Expr& x, const Expr& y) { return arith(Op::Min, x, y, "min"); }
Expr max(const Expr& x, const Expr& y) { return arith(Op::Max, x, y, "max"); }
Expr abs(const Expr& x) {
  check_complete(x, "abs");
  KILN_CHECK(x.kind() != Kind::Bool, "flex", "abs needs a number");
  return make(Op::Abs, x.kind(), {x.node()});
}
Expr tanh(const Expr& x) { return unary_float(Op::Tanh, x, "tanh"); }
Expr exp(const Expr& x) { return unary_float(Op::Exp, x, "exp"); }
Expr log(const Expr& x) { return unary_float(Op::Log, x, "log"); }
Expr sigmoid(const Expr& x) { return unary_float(Op::Sigmoid, x, "sigmoid"); }
Expr sign(const Expr& x) {
  check_complete(x, "sign");
  KILN_CHECK(x.kind() != Kind::Bool, "flex", "sign needs a number, got bool");
  return make(Op::Sign, x.kind(), {x.node()});
}
Expr floor(const Expr& x) {
  check_complete(x, "floor");
  KILN_CHECK(x.kind() != Kind::Bool, "flex", "floor needs a number, got bool");
  return x.kind() == Kind::Int ? x : make(Op::Floor, Kind::Float, {x.node()});
}
Expr to_int(const Expr& x) {
  check_complete(x, "to_int");
  if (x.kind() == Kind::Int) return x;
  if (x.kind() == Kind::Bool) return where(x, Expr(int64_t{1}), Expr(int64_t{0}));
  return make(Op::ToInt, Kind::Int, {x.node()});
}
Expr to_float(const Expr& x) {
  check_complete(x, "to_float");
  if (x.kind() == Kind::Bool) return where(x, Expr(1.0), Expr(0.0));
  return promote(x);
}
Expr clamp(const Expr& x, const Expr& lo, const Expr& hi) { return min(max(x, lo), hi); }
Expr remainder(const Expr& x, const Expr& y) { return x % y; }

namespace {

const char* binary_symbol(Op op) {
  switch (op) {
    case Op::Add: return "+";
    case Op::Sub: return "-";
    case Op::Mul: return "*";
    case Op::Div: return "/";
    case Op::Mod: return "%";
    case Op::Lt: return "<";
    case Op::Le: return "<=";
    case Op::Gt: return ">";
    case Op::Ge: return ">=";
    case Op::Eq: return "==";
    case Op::Ne: return "!=";
    case Op::And: return "&";
    case Op::Or: return "|";
    default: return nullptr;
  }
}

void print(const ExprNode& n, std::ostream& os, std::unordered_map<const CapturedTensor*, int>& names) {
  auto arg = [&](size_t i) { print(*n.args[i], os, names); };
  switch (n.op) {
    case Op::Score: os << "score"; return;
    case Op::B: os << "b"; return;
    case Op::H: os << "h"; return;
    case Op::QIdx: os << "q_idx"; return;
    case Op::KvIdx: os << "kv_idx"; return;
    case Op::ConstInt: os << n.ival; return;
    case Op::ConstBool: os << (n.ival ? "true" : "false"); return;
    case Op::ConstFloat: {
      std::ostringstream s;
      s.precision(17);
      s << n.fval;
      std::string t = s.str();
      if (t.find_first_of(".eEn") == std::string::npos) t += ".0";  // keep it a float literal
      os << t;
      return;
    }
    case Op::Load: {
      auto it = names.find(n.tensor.get());
      if (it == names.end()) it = names.emplace(n.tensor.get(), static_cast<int>(names.size())).first;
      os << "buf" << it->second;
      for (size_t i = 0; i < n.args.size(); ++i) {
        os << "[";
        arg(i);
        os << "]";
      }
      return;
    }
    case Op::ToFloat: os << "float("; arg(0); os << ")"; return;
    case Op::Neg: os << "(-"; arg(0); os << ")"; return;
    case Op::Not: os << "(!"; arg(0); os << ")"; return;
    case Op::Where: os << "where("; arg(0); os << ", "; arg(1); os << ", "; arg(2); os << ")"; return;
    case Op::Min: os << "min("; arg(0); os << ", "; arg(1); os << ")"; return;
    case Op::Max: os << "max("; arg(0); os << ", "; arg(1); os << ")"; return;
    case Op::Abs: os << "abs("; arg(0); os << ")"; return;
    case Op::Tanh: os << "tanh("; arg(0); os << ")"; return;
    case Op::Exp: os << "exp("; arg(0); os << ")"; return;
    case Op::Log: os << "log("; arg(0); os << ")"; return;
    case Op::Sign: os << "sign("; arg(0); os << ")"; return;
    case Op::Sigmoid: os << "sigmoid("; arg(0); os << ")"; return;
    case Op::Floor: os << "floor("; arg(0); os << ")"; return;
    case Op::ToInt: os << "int("; arg(0); os << ")"; return;
    default: {
      os << "(";
      arg(0);
      os << " " << binary_symbol(n.op) << " ";
      arg(1);
      os << ")";
    }
  }
}

}  // namespace

std::string to_string(const Expr& e) {
  std::ostringstream os;
  std::unordered_map<const CapturedTensor*, int> names;
  print(*e.node(), os, names);
  return os.str();
}

int detail::captured_number(const Expr& e, const CapturedTensor* t) {
  std::ostringstream os;
  std::unordered_map<const CapturedTensor*, int> names;
  print(*e.node(), os, names);
  auto it = names.find(t);
  return it == names.end() ? -1 : it->second;
}

MaskMod::MaskMod() : expr(true) {}
MaskMod::MaskMod(Expr e) : expr(std::move(e)) {
  check_complete(expr, "mask_mod");
  KILN_CHECK(expr.kind() == Kind::Bool, "mask_mod", "a mask_mod must be a bool expression, got ",
             kind_name(expr.kind()));
  KILN_CHECK(!any_node(expr.node(), [](const ExprNode& n) { return n.op == Op::Score; }), "mask_mod",
             "a mask_mod cannot read score");
}

ScoreMod::ScoreMod() : expr(score()) {}
ScoreMod::ScoreMod(Expr e) : expr(std::move(e)) {
  check_complete(expr, "score_mod");
  KILN_CHECK(expr.kind() != Kind::Bool, "score_mod", "a score_mod must be a number expression, got bool");
  if (expr.kind() == Kind::Int) expr = promote(expr);
}
bool ScoreMod::is_identity() const { return expr.node()->op == Op::Score; }

namespace detail {

Program compile(const Expr& e) {
  static std::atomic<uint64_t> next_id{1};
  Program p;
  p.id = next_id.fetch_add(1);
  std::unordered_map<const ExprNode*, int32_t> ids;
  std::unordered_map<const CapturedTensor*, int32_t> bufs;
  std::function<int32_t(const ExprNode&)> visit = [&](const ExprNode& n) -> int32_t {
    auto it = ids.find(&n);
    if (it != ids.end()) return it->second;
    Instr in{n.op, n.kind};
    int32_t operands[3] = {-1, -1, -1};
    for (size_t i = 0; i < n.args.size() && i < 3; ++i) operands[i] = visit(*n.args[i]);
    in.a = operands[0];
    in.b = operands[1];
    in.c = operands[2];
    in.ival = n.ival;
    in.fval = n.fval;
    if (n.op == Op::Load) {
      in.nidx = static_cast<int32_t>(n.args.size());
      auto bt = bufs.find(n.tensor.get());
      if (bt == bufs.end()) {
        Buffer buf;
        buf.src = n.tensor;
        buf.kind = n.tensor->kind;
        const Tensor t = n.tensor->tensor.detach().contiguous();
        buf.ndim = static_cast<int>(t.dim());
        for (int d = 0; d < buf.ndim; ++d) buf.sizes[d] = t.size(d);
        buf.numel = t.numel();
        int64_t st = 1;
        for (int d = buf.ndim - 1; d >= 0; --d) {
          buf.strides[d] = st;
          st *= buf.sizes[d];
        }
        const std::vector<double> vals = t.to_vector();
        if (buf.kind == Kind::Float) {
          buf.dvals = vals;
          buf.fvals.assign(vals.begin(), vals.end());
          buf.needs_grad = n.tensor->tensor.requires_grad();
        } else {
          buf.ivals.resize(vals.size());
          for (size_t i = 0; i < vals.size(); ++i) buf.ivals[i] = static_cast<int64_t>(vals[i]);
        }
        p.any_grad = p.any_grad || buf.needs_grad;
        bt = bufs.emplace(n.tensor.get(), static_cast<int32_t>(p.buffers.size())).first;
        p.buffers.push_back(std::move(buf));
      }
      in.buf = bt->second;
      p.reads_tensors = true;
    }
    if (n.op == Op::Score) p.uses_score = true;
    // An adjoint is needed where a float value depends on score or on a grad-requiring load.
    bool adj = n.op == Op::Score || (n.op == Op::Load && p.buffers[in.buf].needs_grad);
    // floor and sign are flat (zero gradient): nothing flows through them.
    if (n.kind == Kind::Float && n.op != Op::ToFloat && n.op != Op::Floor && n.op != Op::Sign)
      for (int32_t o : operands)
        if (o >= 0 && p.code[o].needs_adj) adj = true;
    in.needs_adj = adj && n.kind == Kind::Float;
    p.code.push_back(in);
    const int32_t id = static_cast<int32_t>(p.code.size() - 1);
    ids.emplace(&n, id);
    return id;
  };
  p.result = visit(*e.node());
  return p;
}

bool score_grad_is_one(const Program& p) {
  if (p.any_grad || p.result < 0) return false;
  // Every instruction that result reaches through a differentiated operand has exactly one such
  // operand, so the reachable ones form a chain: follow it down to score through + and - only.
  for (int32_t k = p.result;;) {
    const Instr& in = p.code[k];
    if (in.op == Op::Score) return true;
    const bool a = in.a >= 0 && p.code[in.a].needs_adj, b = in.b >= 0 && p.code[in.b].needs_adj;
    if (in.op == Op::Add && a != b) k = a ? in.a : in.b;
    else if (in.op == Op::Sub && a && !b) k = in.a;
    else return false;
  }
}

}  // namespace detail
}  // namespace kiln::flex
