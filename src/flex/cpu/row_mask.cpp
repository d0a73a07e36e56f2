// Fast mask_mod rows for masks built from integer affine comparisons of the indices (causal,
// sliding window, prefix LM, and their and/or/not): with b, h, q fixed, every integer instruction
// is A * kv + C and every boolean a step function of kv, kept as its value at kv = -inf plus the
// sorted kv positions where it flips. A row is a handful of scalar operations plus a fill of the
// masked runs, instead of a loop over the kv positions per instruction. The result is exact
// (integer arithmetic), so it equals the per-element evaluation bit for bit; a row that does not
// fit (a kv-dependent division, load, or too many flips) reports false and the caller falls back.
#include <algorithm>
#include <limits>

#include "flex/cpu/attention.h"

namespace kiln::flex::cpu {
namespace {

int64_t floor_div(int64_t x, int64_t y) {
  if (y == 0) return 0;  // as the row evaluator
  int64_t q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}
int64_t floor_mod(int64_t x, int64_t y) { return y == 0 ? 0 : x - floor_div(x, y) * y; }
int64_t ceil_div_pos(int64_t x, int64_t y) { return -floor_div(-x, y); }  // y > 0

bool supported(const detail::Program& p) {
  if (p.uses_score) return false;
  for (const detail::Instr& in : p.code) {
    if (in.kind == Kind::Float) return false;
    switch (in.op) {
      case Op::B: case Op::H: case Op::QIdx: case Op::KvIdx: case Op::ConstInt: case Op::ConstBool:
      case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Mod: case Op::Neg:
      case Op::And: case Op::Or: case Op::Not: case Op::Min: case Op::Max: case Op::Abs:
        break;
      case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Eq: case Op::Ne:
        if (p.code[in.a].kind != Kind::Int) return false;
        break;
      case Op::Where:
        if (in.kind != Kind::Bool) return false;
        break;
      case Op::Load:
        if (in.kind == Kind::Float) return false;
        break;
      default: return false;
    }
  }
  return p.code[p.result].kind == Kind::Bool;
}

}  // namespace

AffineMask::AffineMask(const detail::Program& p) : prog_(&p), ok_(supported(p)) {
  if (ok_) {
    ints_.resize(p.code.size());
    bools_.resize(p.code.size());
  }
}

// Step function combine: value at -inf and flips of op(x, y), both step functions.
template <typename Op2>
bool AffineMask::combine(const Step& x, const Step& y, Op2 f, Step& out) {
  out.v0 = f(x.v0, y.v0);
  out.n = 0;
  bool vx = x.v0, vy = y.v0, cur = out.v0;
  int i = 0, j = 0;
  while (i < x.n || j < y.n) {
    const int64_t t = (j == y.n || (i < x.n && x.at[i] <= y.at[j])) ? x.at[i] : y.at[j];
    while (i < x.n && x.at[i] == t) { vx = !vx; ++i; }
    while (j < y.n && y.at[j] == t) { vy = !vy; ++j; }
    const bool v = f(vx, vy);
    if (v != cur) {
      if (out.n == kMaxFlips) return false;
      out.at[out.n++] = t;
      cur = v;
    }
  }
  return true;
}

bool AffineMask::eval(int64_t b, int64_t h, int64_t q) {
  const std::vector<detail::Instr>& code = prog_->code;
  for (size_t k = 0; k < code.size(); ++k) {
    const detail::Instr& in = code[k];
    Lin& I = ints_[k];
    Step& S = bools_[k];
    const Lin* la = in.a >= 0 ? &ints_[in.a] : nullptr;
    const Lin* lb = in.b >= 0 ? &ints_[in.b] : nullptr;
    switch (in.op) {
      case Op::B: I = {0, b}; break;
      case Op::H: I = {0, h}; break;
      case Op::QIdx: I = {0, q}; break;
      case Op::KvIdx: I = {1, 0}; break;
      case Op::ConstInt: I = {0, in.ival}; break;
      case Op::ConstBool: S = {in.ival != 0, 0, {}}; break;
      case Op::Add: I = {la->a + lb->a, la->c + lb->c}; break;
      case Op::Sub: I = {la->a - lb->a, la->c - lb->c}; break;
      case Op::Neg: I = {-la->a, -la->c}; break;
      case Op::Mul:
        if (la->a != 0 && lb->a != 0) return false;
        I = {la->a * lb->c + lb->a * la->c, la->c * lb->c};
        break;
      case Op::Div: case Op::Mod: case Op::Min: case Op::Max: case Op::Abs: {
        if (la->a != 0 || (lb && lb->a != 0)) return false;  // kv-dependent: not affine
        const int64_t x = la->c, y = lb ? lb->c : 0;
        const int64_t r = in.op == Op::Div ? floor_div(x, y) : in.op == Op::Mod ? floor_mod(x, y)
                          : in.op == Op::Min ? std::min(x, y) : in.op == Op::Max ? std::max(x, y) : (x < 0 ? -x : x);
        I = {0, r};
        break;
      }
      case Op::Load: {
        const detail::Buffer& buf = prog_->buffers[in.buf];
        const int32_t idx[3] = {in.a, in.b, in.c};
        int64_t flat = 0;
        for (int d = 0; d < in.nidx; ++d) {
          const Lin& x = ints_[idx[d]];
          if (x.a != 0) return false;  // a kv-dependent gather
          if (x.c < 0 || x.c >= buf.sizes[d]) index_error_ = true;
          flat += std::clamp<int64_t>(x.c, 0, buf.sizes[d] - 1) * buf.strides[d];
        }
        if (in.kind == Kind::Int) I = {0, buf.ivals[flat]};
        else S = {buf.ivals[flat] != 0, 0, {}};
        break;
      }
      case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Eq: case Op::Ne: {
        // d(kv) = A kv + C compared with 0.
        int64_t A = la->a - lb->a, C = la->c - lb->c;
        Op op = in.op;
        if (A < 0) {  // make d increasing: flip the comparison
          A = -A;
          C = -C;
          op = op == Op::Lt ? Op::Gt : op == Op::Le ? Op::Ge : op == Op::Gt ? Op::Lt : op == Op::Ge ? Op::Le : op;
        }
        if (A == 0) {
          const bool v = op == Op::Lt ? C < 0 : op == Op::Le ? C <= 0 : op == Op::Gt ? C > 0
                         : op == Op::Ge ? C >= 0 : op == Op::Eq ? C == 0 : C != 0;
          S = {v, 0, {}};
          break;
        }
        // d < 0 <=> kv < ceil(-C / A); d <= 0 <=> kv < floor(-C / A) + 1.
        const int64_t t_lt = ceil_div_pos(-C, A), t_le = floor_div(-C, A) + 1;
        switch (op) {
          case Op::Lt: S = {true, 1, {t_lt}}; break;
          case Op::Le: S = {true, 1, {t_le}}; break;
          case Op::Gt: S = {false, 1, {t_le}}; break;
          case Op::Ge: S = {false, 1, {t_lt}}; break;
          case Op::Eq:
          case Op::Ne:
            if (t_lt < t_le) S = {op == Op::Ne, 2, {t_lt, t_le}};  // one kv hits 0 exactly
            else S = {op == Op::Ne, 0, {}};
            break;
          default: break;
        }
        break;
      }
      case Op::And:
        if (!combine(bools_[in.a], bools_[in.b], [](bool x, bool y) { return x && y; }, S)) return false;
        break;
      case Op::Or:
        if (!combine(bools_[in.a], bools_[in.b], [](bool x, bool y) { return x || y; }, S)) return false;
        break;
      case Op::Not:
        S = bools_[in.a];
        S.v0 = !S.v0;
        break;
      case Op::Where: {  // (c and x) or (not c and y)
        Step cx, ncy, nc = bools_[in.a];
        nc.v0 = !nc.v0;
        auto land = [](bool x, bool y) { return x && y; };
        if (!combine(bools_[in.a], bools_[in.b], land, cx) || !combine(nc, bools_[in.c], land, ncy) ||
            !combine(cx, ncy, [](bool x, bool y) { return x || y; }, S))
          return false;
        break;
      }
      default: return false;
    }
  }
  return true;
}

const AffineMask::Step* AffineMask::row(int64_t b, int64_t h, int64_t q) {
  if (b == rb_ && h == rh_ && q >= rq0_ && q < rq0_ + static_cast<int64_t>(rows_.size())) return &rows_[q - rq0_];
  if (!ok_ || !eval(b, h, q)) return nullptr;
  return &bools_[prog_->result];
}

template <typename F>
bool AffineMask::apply(int64_t b, int64_t h, int64_t q, int64_t c0, int64_t n, F* s) {
  const Step* step = row(b, h, q);
  if (!step) return false;
  const Step& r = *step;
  const F kNegInf = -std::numeric_limits<F>::infinity();
  bool v = r.v0;
  int64_t from = c0;  // start of the current run, kv coordinates
  for (int i = 0; i <= r.n; ++i) {
    const int64_t to = i < r.n ? r.at[i] : c0 + n;
    const int64_t lo = std::clamp<int64_t>(from, c0, c0 + n), hi = std::clamp<int64_t>(to, c0, c0 + n);
    if (!v) std::fill(s + (lo - c0), s + (hi - c0), kNegInf);
    from = std::max(from, to);
    v = !v;
  }
  return true;
}

bool AffineMask::bounds(int64_t b, int64_t h, int64_t q0, int64_t m, int64_t c0, int64_t n, int32_t* lo,
                        int32_t* hi) {
  rb_ = -1;  // the cache is refilled below; invalid until every row fits
  rows_.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    if (!ok_ || !eval(b, h, q0 + i)) return false;
    rows_[i] = bools_[prog_->result];
    row_bounds(rows_[i], c0, n, lo[i], hi[i]);
  }
  rb_ = b;
  rh_ = h;
  rq0_ = q0;
  return true;
}

void AffineMask::row_bounds(const Step& r, int64_t c0, int64_t n, int32_t& lo, int32_t& hi) {
  int64_t first = n, last = 0;  // kept positions: [first, last)
  bool v = r.v0;
  int64_t from = c0;
  for (int i = 0; i <= r.n; ++i) {
    const int64_t to = i < r.n ? r.at[i] : c0 + n;
    const int64_t a = std::clamp<int64_t>(from, c0, c0 + n) - c0, e = std::clamp<int64_t>(to, c0, c0 + n) - c0;
    if (v && a < e) {
      first = std::min(first, a);
      last = std::max(last, e);
    }
    from = std::max(from, to);
    v = !v;
  }
  if (first >= last) first = last = 0;
  lo = static_cast<int32_t>(first);
  hi = static_cast<int32_t>(last);
}

template bool AffineMask::apply<float>(int64_t, int64_t, int64_t, int64_t, int64_t, float*);
template bool AffineMask::apply<double>(int64_t, int64_t, int64_t, int64_t, int64_t, double*);

}  // namespace kiln::flex::cpu
