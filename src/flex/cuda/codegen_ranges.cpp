// MASK_RANGES: the runs of a mask row (and column). A mask whose every part that depends on the
// free index x (kv for a row, q for a column) is a comparison of +-x with an x-free int, joined by &
// (and | with x-free bools), keeps one interval of x; the kernels then test an element with one
// subtraction and one unsigned compare instead of evaluating the mask (causal, sliding windows and
// their & compositions; not prefix-LM, a union of two runs, nor a document mask, whose doc[kv] is
// not x-free and which takes mask bits).
#include <sstream>
#include <string>
#include <vector>

#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {
namespace {

using detail::Instr;
using detail::Program;

// What an instruction is as a function of x: free of it, an int coef x + c<k>, a bool that does not
// change with x (its local v<k> holds it), or a bool true on x in [l<k>, u<k>].
enum class Form : uint8_t { Free, Linear, Uniform, Interval };

std::string name(char prefix, size_t k) { return std::string(1, prefix) + std::to_string(k); }

}  // namespace

bool emit_mask_range(const Program& p, Op var, const char* fn, const std::string& forward, std::ostream& out) {
  std::vector<Form> form(p.code.size(), Form::Free);
  std::vector<int64_t> coef(p.code.size(), 0);
  std::ostringstream os;
  const char* big = "(1LL << 62)";
  // The x-free int part of operand o: its own value, or the c<o> of a linear one.
  auto c_of = [&](int32_t o) { return form[o] == Form::Linear ? name('c', o) : "(long long)" + name('v', o); };
  for (size_t k = 0; k < p.code.size(); ++k) {
    const Instr& in = p.code[k];
    const int32_t ops[3] = {in.a, in.b, in.c};
    bool free = in.op != var, uniform = true;
    for (int32_t o : ops) {
      if (o < 0) continue;
      free = free && form[o] == Form::Free;
      uniform = uniform && (form[o] == Form::Free || form[o] == Form::Uniform);
    }
    if (in.op == Op::Load && !free) return false;  // a tensor indexed by x: not a run
    if (free) continue;
    if (in.op == var) {
      form[k] = Form::Linear, coef[k] = 1;
      os << "  const long long " << name('c', k) << " = 0LL;\n";
      continue;
    }
    const bool is_cmp = in.op == Op::Lt || in.op == Op::Le || in.op == Op::Gt || in.op == Op::Ge ||
                        in.op == Op::Eq || in.op == Op::Ne;
    if (in.kind == Kind::Int && (in.op == Op::Add || in.op == Op::Sub || in.op == Op::Neg)) {
      const int64_t ca = form[in.a] == Form::Linear ? coef[in.a] : 0;
      const int64_t cb = in.b >= 0 && form[in.b] == Form::Linear ? coef[in.b] : 0;
      if ((in.b >= 0 && p.code[in.b].kind != Kind::Int) || p.code[in.a].kind != Kind::Int) return false;
      form[k] = Form::Linear;
      coef[k] = in.op == Op::Add ? ca + cb : in.op == Op::Sub ? ca - cb : -ca;
      os << "  const long long " << name('c', k) << " = "
         << (in.op == Op::Neg ? "-" + c_of(in.a)
                              : c_of(in.a) + (in.op == Op::Add ? " + " : " - ") + c_of(in.b))
         << ";\n";
      continue;
    }
    if (is_cmp && p.code[in.a].kind == Kind::Int && p.code[in.b].kind == Kind::Int) {
      const int64_t d = (form[in.a] == Form::Linear ? coef[in.a] : 0) - (form[in.b] == Form::Linear ? coef[in.b] : 0);
      if (d == 0) {  // x cancels: the same value for every x
        form[k] = Form::Uniform;
        continue;
      }
      if ((d != 1 && d != -1) || in.op == Op::Ne) return false;
      // a - b = d x + r: a cmp b holds on an interval of x.
      const std::string r = "(" + c_of(in.a) + " - " + c_of(in.b) + ")", m = "(-" + r + ")";
      std::string lo = "-" + std::string(big), hi = big;
      const bool up = d == 1;  // x + r cmp 0 (up) or -x + r cmp 0
      switch (in.op) {
        case Op::Ge: (up ? lo : hi) = up ? m : r; break;
        case Op::Gt: (up ? lo : hi) = up ? m + " + 1" : r + " - 1"; break;
        case Op::Le: (up ? hi : lo) = up ? m : r; break;
        case Op::Lt: (up ? hi : lo) = up ? m + " - 1" : r + " + 1"; break;
        default: lo = hi = up ? m : r; break;  // Eq
      }
      form[k] = Form::Interval;
      os << "  const long long " << name('l', k) << " = " << lo << ", " << name('u', k) << " = " << hi << ";\n";
      continue;
    }
    if (uniform && in.kind == Kind::Bool) {  // every operand the same for every x
      form[k] = Form::Uniform;
      continue;
    }
    if ((in.op == Op::And || in.op == Op::Or) && p.code[in.a].kind == Kind::Bool) {
      const bool ia = form[in.a] == Form::Interval, ib = form[in.b] == Form::Interval;
      const std::string L = name('l', k), U = name('u', k);
      form[k] = Form::Interval;
      if (ia && ib && in.op == Op::And) {
        os << "  const long long " << L << " = max(" << name('l', in.a) << ", " << name('l', in.b) << "), " << U
           << " = min(" << name('u', in.a) << ", " << name('u', in.b) << ");\n";
        continue;
      }
      if (ia && ib) return false;  // the union of two runs need not be one
      const int32_t run = ia ? in.a : in.b, cond = ia ? in.b : in.a;
      const std::string v = "(bool)" + name('v', cond);
      if (in.op == Op::And)
        os << "  const long long " << L << " = " << v << " ? " << name('l', run) << " : " << big << ", " << U << " = "
           << name('u', run) << ";\n";
      else
        os << "  const long long " << L << " = " << v << " ? -" << big << " : " << name('l', run) << ", " << U
           << " = " << v << " ? " << big << " : " << name('u', run) << ";\n";
      continue;
    }
    return false;
  }
  const size_t r = static_cast<size_t>(p.result);
  out << "__device__ __forceinline__ void " << fn
      << "(long long b, long long h, long long q, long long kv, const FlexParams& P, long long* lo, long long* hi) {\n"
      << forward << os.str();
  if (form[r] == Form::Interval) out << "  *lo = " << name('l', r) << ";\n  *hi = " << name('u', r) << ";\n";
  else out << "  *lo = (bool)" << name('v', r) << " ? -" << big << " : " << big << ";\n  *hi = " << big << ";\n";
  out << "}\n\n";
  return true;
}

}  // namespace kiln::flex::cuda
