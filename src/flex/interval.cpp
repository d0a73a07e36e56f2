// Interval evaluation of a compiled mask: every value becomes the set of values it can take while
// q_idx and kv_idx range over a box (a block, or a run of blocks). A bool result that can only be
// true marks the box full, only false empty. Loads from captured tensors use the tensor's min/max
// over the index range (a min/max pyramid along the last dim), so sorted document ids classify
// exactly except at document boundaries. The same evaluation over the narrow index bounds, loads
// unbounded, tells the CUDA codegen which int locals fit 32 bits.
#include <algorithm>
#include <cmath>
#include <limits>

#include "flex/ir.h"

namespace kiln::flex::detail {
namespace {

__extension__ typedef __int128 I128;  // exact products of int64 bounds (GCC/Clang)

constexpr int64_t kChunk = 16;  // pyramid leaves cover 16 elements: 1/8 of the tensor in memory
constexpr int64_t kBig = std::numeric_limits<int64_t>::max() / 4;
constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t sat(I128 v) { return v > kBig ? kBig : v < -kBig ? -kBig : static_cast<int64_t>(v); }

int64_t floor_div(int64_t x, int64_t y) {
  if (y == 0) return 0;
  int64_t q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}

void fix_float(Interval& r) {
  if (std::isnan(r.flo) || std::isnan(r.fhi)) {
    r.flo = -kInf;
    r.fhi = kInf;
    r.nan = true;
  }
}

Interval from_bool(bool can_false, bool can_true) {
  Interval r;
  r.can_false = can_false;
  r.can_true = can_true;
  return r;
}

// Comparison of two ranges: (always true, always false) for x OP y.
Interval compare(Op op, double alo, double ahi, double blo, double bhi, bool nan) {
  bool t = false, f = false;
  switch (op) {
    case Op::Lt: t = ahi < blo; f = alo >= bhi; break;
    case Op::Le: t = ahi <= blo; f = alo > bhi; break;
    case Op::Gt: t = alo > bhi; f = ahi <= blo; break;
    case Op::Ge: t = alo >= bhi; f = ahi < blo; break;
    case Op::Eq: t = alo == ahi && blo == bhi && alo == blo; f = ahi < blo || bhi < alo; break;
    case Op::Ne: f = alo == ahi && blo == bhi && alo == blo; t = ahi < blo || bhi < alo; break;
    default: break;
  }
  if (nan) t = f = false;
  return from_bool(!t, !f);
}

// Int comparisons without going through double (exact for any int64).
Interval compare_int(Op op, int64_t alo, int64_t ahi, int64_t blo, int64_t bhi) {
  bool t = false, f = false;
  switch (op) {
    case Op::Lt: t = ahi < blo; f = alo >= bhi; break;
    case Op::Le: t = ahi <= blo; f = alo > bhi; break;
    case Op::Gt: t = alo > bhi; f = ahi <= blo; break;
    case Op::Ge: t = alo >= bhi; f = ahi < blo; break;
    case Op::Eq: t = alo == ahi && blo == bhi && alo == blo; f = ahi < blo || bhi < alo; break;
    case Op::Ne: f = alo == ahi && blo == bhi && alo == blo; t = ahi < blo || bhi < alo; break;
    default: break;
  }
  return from_bool(!t, !f);
}

}  // namespace

void Buffer::build_pyramid() const {
  if (!level_off.empty()) return;
  const int64_t len = sizes[ndim - 1];
  int64_t n = (len + kChunk - 1) / kChunk, total = 0;
  for (;;) {
    level_off.push_back(total);
    total += n;
    if (n == 1) break;
    n = (n + 1) / 2;
  }
  row_pyr = total;
  const int64_t rows = numel / len;
  pyr_min.assign(static_cast<size_t>(rows * total), kInf);
  pyr_max.assign(static_cast<size_t>(rows * total), -kInf);
  auto value = [&](int64_t i) { return kind == Kind::Float ? dvals[i] : static_cast<double>(ivals[i]); };
  for (int64_t r = 0; r < rows; ++r) {
    double* mn = pyr_min.data() + r * total;
    double* mx = pyr_max.data() + r * total;
    for (int64_t i = 0; i < len; ++i) {
      const double x = value(r * len + i);
      mn[i / kChunk] = std::min(mn[i / kChunk], x);
      mx[i / kChunk] = std::max(mx[i / kChunk], x);
    }
    for (size_t l = 1; l < level_off.size(); ++l) {
      const int64_t prev = level_off[l - 1], cur = level_off[l], count = level_off[l - 1 + 1] - prev;
      for (int64_t i = 0; i < count; ++i) {
        mn[cur + i / 2] = std::min(mn[cur + i / 2], mn[prev + i]);
        mx[cur + i / 2] = std::max(mx[cur + i / 2], mx[prev + i]);
      }
    }
  }
}

void Buffer::range(const int64_t* lo, const int64_t* hi, double* mn_out, double* mx_out) const {
  build_pyramid();
  const int64_t len = sizes[ndim - 1];
  int64_t rows_in_box = 1;
  for (int d = 0; d < ndim - 1; ++d) rows_in_box *= hi[d] - lo[d] + 1;
  double mn = kInf, mx = -kInf;
  if (rows_in_box > 256) {  // a huge box: the whole tensor's range (still a sound bound)
    const int64_t rows = numel / len, top = level_off.back();
    for (int64_t r = 0; r < rows; ++r) {
      mn = std::min(mn, pyr_min[r * row_pyr + top]);
      mx = std::max(mx, pyr_max[r * row_pyr + top]);
    }
    *mn_out = mn;
    *mx_out = mx;
    return;
  }
  auto value = [&](int64_t i) { return kind == Kind::Float ? dvals[i] : static_cast<double>(ivals[i]); };
  int64_t idx[3] = {lo[0], lo[1], lo[2]};
  for (;;) {
    int64_t row = 0;
    for (int d = 0; d < ndim - 1; ++d) row = row * sizes[d] + idx[d];
    const double* pmn = pyr_min.data() + row * row_pyr;
    const double* pmx = pyr_max.data() + row * row_pyr;
    int64_t a = lo[ndim - 1], z = hi[ndim - 1];
    // Raw elements up to the first chunk boundary and after the last, pyramid in between.
    while (a <= z && a % kChunk != 0) { const double x = value(row * len + a++); mn = std::min(mn, x); mx = std::max(mx, x); }
    while (a <= z && (z + 1) % kChunk != 0 && z + 1 != len) {
      const double x = value(row * len + z--);
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    if (a <= z) {
      int64_t c0 = a / kChunk, c1 = z / kChunk;
      for (size_t l = 0; c0 <= c1 && l < level_off.size(); ++l) {
        const int64_t off = level_off[l];
        if (c0 & 1) { mn = std::min(mn, pmn[off + c0]); mx = std::max(mx, pmx[off + c0]); ++c0; }
        if (c0 <= c1 && !(c1 & 1)) { mn = std::min(mn, pmn[off + c1]); mx = std::max(mx, pmx[off + c1]); --c1; }
        if (c0 > c1) break;
        c0 >>= 1;  // c0 is even and c1 odd here: their parents cover exactly the rest
        c1 >>= 1;
      }
    }
    int d = ndim - 2;
    for (; d >= 0; --d) {
      if (++idx[d] <= hi[d]) break;
      idx[d] = lo[d];
    }
    if (d < 0) break;
  }
  *mn_out = mn;
  *mx_out = mx;
}

namespace {

// The index box: b, h, q, kv each in [lo, hi]. Without data, loads are unbounded (the bounds then
// hold for any captured values, as the CUDA codegen needs: its source never depends on data).
struct Box {
  int64_t lo[4], hi[4];
};

void eval_box(const Program& p, const Box& box, bool data, std::vector<Interval>& regs) {
  regs.resize(p.code.size());
  for (size_t k = 0; k < p.code.size(); ++k) {
    const Instr& in = p.code[k];
    Interval r;
    const Interval* A = in.a >= 0 ? &regs[in.a] : nullptr;
    const Interval* Bv = in.b >= 0 ? &regs[in.b] : nullptr;
    const Interval* C = in.c >= 0 ? &regs[in.c] : nullptr;
    const bool is_int = in.kind == Kind::Int;
    switch (in.op) {
      case Op::Score: r.flo = -kInf; r.fhi = kInf; r.nan = true; break;
      case Op::B: r.ilo = box.lo[0]; r.ihi = box.hi[0]; break;
      case Op::H: r.ilo = box.lo[1]; r.ihi = box.hi[1]; break;
      case Op::QIdx: r.ilo = box.lo[2]; r.ihi = box.hi[2]; break;
      case Op::KvIdx: r.ilo = box.lo[3]; r.ihi = box.hi[3]; break;
      case Op::ConstInt: r.ilo = r.ihi = in.ival; break;
      case Op::ConstFloat: r.flo = r.fhi = in.fval; fix_float(r); break;
      case Op::ConstBool: r = from_bool(in.ival == 0, in.ival != 0); break;
      case Op::ToFloat: r.flo = static_cast<double>(A->ilo); r.fhi = static_cast<double>(A->ihi); break;
      case Op::Load: {
        if (!data) {
          r.ilo = -kBig;
          r.ihi = kBig;
          r.flo = -kInf;
          r.fhi = kInf;
          r.nan = r.can_false = r.can_true = true;
          break;
        }
        const Buffer& buf = p.buffers[in.buf];
        int64_t lo[3] = {0, 0, 0}, hv[3] = {0, 0, 0};
        const int32_t ops[3] = {in.a, in.b, in.c};
        for (int d = 0; d < in.nidx; ++d) {
          const Interval& x = regs[ops[d]];
          lo[d] = std::clamp<int64_t>(x.ilo, 0, buf.sizes[d] - 1);
          hv[d] = std::clamp<int64_t>(x.ihi, 0, buf.sizes[d] - 1);
        }
        double mn, mx;
        buf.range(lo, hv, &mn, &mx);
        if (in.kind == Kind::Float) {
          r.flo = mn;
          r.fhi = mx;
          fix_float(r);
        } else if (in.kind == Kind::Int) {
          r.ilo = static_cast<int64_t>(mn);
          r.ihi = static_cast<int64_t>(mx);
        } else {
          r = from_bool(mn == 0, mx != 0);
        }
        break;
      }
      case Op::Add:
        if (is_int) { r.ilo = sat(I128(A->ilo) + Bv->ilo); r.ihi = sat(I128(A->ihi) + Bv->ihi); }
        else { r.flo = A->flo + Bv->flo; r.fhi = A->fhi + Bv->fhi; r.nan = A->nan || Bv->nan; fix_float(r); }
        break;
      case Op::Sub:
        if (is_int) { r.ilo = sat(I128(A->ilo) - Bv->ihi); r.ihi = sat(I128(A->ihi) - Bv->ilo); }
        else { r.flo = A->flo - Bv->fhi; r.fhi = A->fhi - Bv->flo; r.nan = A->nan || Bv->nan; fix_float(r); }
        break;
      case Op::Mul:
        if (is_int) {
          const I128 c[4] = {I128(A->ilo) * Bv->ilo, I128(A->ilo) * Bv->ihi, I128(A->ihi) * Bv->ilo,
                                 I128(A->ihi) * Bv->ihi};
          r.ilo = sat(std::min({c[0], c[1], c[2], c[3]}));
          r.ihi = sat(std::max({c[0], c[1], c[2], c[3]}));
        } else {
          const double c[4] = {A->flo * Bv->flo, A->flo * Bv->fhi, A->fhi * Bv->flo, A->fhi * Bv->fhi};
          r.flo = std::min({c[0], c[1], c[2], c[3]});
          r.fhi = std::max({c[0], c[1], c[2], c[3]});
          r.nan = A->nan || Bv->nan;
          for (double x : c) if (std::isnan(x)) r.nan = true;
          if (r.nan) { r.flo = -kInf; r.fhi = kInf; }
        }
        break;
      case Op::Div:
        if (is_int) {
          if (Bv->ilo > 0 || Bv->ihi < 0) {
            const int64_t c[4] = {floor_div(A->ilo, Bv->ilo), floor_div(A->ilo, Bv->ihi), floor_div(A->ihi, Bv->ilo),
                                  floor_div(A->ihi, Bv->ihi)};
            r.ilo = std::min({c[0], c[1], c[2], c[3]});
            r.ihi = std::max({c[0], c[1], c[2], c[3]});
          } else {
            r.ilo = -kBig;
            r.ihi = kBig;
          }
        } else if (Bv->flo > 0 || Bv->fhi < 0) {
          const double c[4] = {A->flo / Bv->flo, A->flo / Bv->fhi, A->fhi / Bv->flo, A->fhi / Bv->fhi};
          r.flo = std::min({c[0], c[1], c[2], c[3]});
          r.fhi = std::max({c[0], c[1], c[2], c[3]});
          r.nan = A->nan || Bv->nan;
          for (double x : c) if (std::isnan(x)) r.nan = true;
          if (r.nan) { r.flo = -kInf; r.fhi = kInf; }
        } else {
          r.flo = -kInf;
          r.fhi = kInf;
          r.nan = true;
        }
        break;
      case Op::Mod:
        if (Bv->ilo == Bv->ihi && Bv->ilo > 0) {
          const int64_t c = Bv->ilo;
          if (floor_div(A->ilo, c) == floor_div(A->ihi, c)) {
            r.ilo = A->ilo - floor_div(A->ilo, c) * c;
            r.ihi = A->ihi - floor_div(A->ihi, c) * c;
          } else {
            r.ilo = 0;
            r.ihi = c - 1;
          }
        } else if (Bv->ilo > 0) {
          r.ilo = 0;
          r.ihi = Bv->ihi - 1;
        } else {
          r.ilo = -kBig;
          r.ihi = kBig;
        }
        break;
      case Op::Neg:
        if (is_int) { r.ilo = -A->ihi; r.ihi = -A->ilo; }
        else { r.flo = -A->fhi; r.fhi = -A->flo; r.nan = A->nan; }
        break;
      case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Eq: case Op::Ne: {
        const Kind ak = p.code[in.a].kind;
        if (ak == Kind::Int) r = compare_int(in.op, A->ilo, A->ihi, Bv->ilo, Bv->ihi);
        else if (ak == Kind::Float) r = compare(in.op, A->flo, A->fhi, Bv->flo, Bv->fhi, A->nan || Bv->nan);
        else {
          const bool point = A->can_true != A->can_false && Bv->can_true != Bv->can_false;
          const bool eq = A->can_true == Bv->can_true;
          if (!point) r = from_bool(true, true);
          else r = from_bool(in.op == Op::Eq ? !eq : eq, in.op == Op::Eq ? eq : !eq);
        }
        break;
      }
      case Op::And: r = from_bool(A->can_false || Bv->can_false, A->can_true && Bv->can_true); break;
      case Op::Or: r = from_bool(A->can_false && Bv->can_false, A->can_true || Bv->can_true); break;
      case Op::Not: r = from_bool(A->can_true, A->can_false); break;
      case Op::Where: {
        const Interval &X = *Bv, &Y = *C;
        if (!A->can_false) r = X;
        else if (!A->can_true) r = Y;
        else {
          r.ilo = std::min(X.ilo, Y.ilo);
          r.ihi = std::max(X.ihi, Y.ihi);
          r.flo = std::min(X.flo, Y.flo);
          r.fhi = std::max(X.fhi, Y.fhi);
          r.nan = X.nan || Y.nan;
          r.can_false = X.can_false || Y.can_false;
          r.can_true = X.can_true || Y.can_true;
        }
        break;
      }
      case Op::Min:
        if (is_int) { r.ilo = std::min(A->ilo, Bv->ilo); r.ihi = std::min(A->ihi, Bv->ihi); }
        else { r.flo = std::min(A->flo, Bv->flo); r.fhi = std::min(A->fhi, Bv->fhi); r.nan = A->nan || Bv->nan; }
        break;
      case Op::Max:
        if (is_int) { r.ilo = std::max(A->ilo, Bv->ilo); r.ihi = std::max(A->ihi, Bv->ihi); }
        else { r.flo = std::max(A->flo, Bv->flo); r.fhi = std::max(A->fhi, Bv->fhi); r.nan = A->nan || Bv->nan; }
        break;
      case Op::Abs:
        if (is_int) {
          if (A->ilo >= 0) { r.ilo = A->ilo; r.ihi = A->ihi; }
          else if (A->ihi <= 0) { r.ilo = -A->ihi; r.ihi = -A->ilo; }
          else { r.ilo = 0; r.ihi = std::max(-A->ilo, A->ihi); }
        } else {
          if (A->flo >= 0) { r.flo = A->flo; r.fhi = A->fhi; }
          else if (A->fhi <= 0) { r.flo = -A->fhi; r.fhi = -A->flo; }
          else { r.flo = 0; r.fhi = std::max(-A->flo, A->fhi); }
          r.nan = A->nan;
        }
        break;
      case Op::Tanh: r.flo = std::tanh(A->flo); r.fhi = std::tanh(A->fhi); r.nan = A->nan; break;
      case Op::Exp: r.flo = std::exp(A->flo); r.fhi = std::exp(A->fhi); r.nan = A->nan; break;
      case Op::Log:
        r.nan = A->nan || A->flo < 0;
        r.flo = std::log(std::max(A->flo, 0.0));
        r.fhi = std::log(std::max(A->fhi, 0.0));
        fix_float(r);
        break;
      case Op::Sign:  // monotone
        if (is_int) { r.ilo = (A->ilo > 0) - (A->ilo < 0); r.ihi = (A->ihi > 0) - (A->ihi < 0); }
        else { r.flo = A->flo > 0 ? 1.0 : A->flo < 0 ? -1.0 : 0.0; r.fhi = A->fhi > 0 ? 1.0 : A->fhi < 0 ? -1.0 : 0.0; r.nan = A->nan; }
        break;
      case Op::Sigmoid:
        r.flo = 1.0 / (1.0 + std::exp(-A->flo));
        r.fhi = 1.0 / (1.0 + std::exp(-A->fhi));
        r.nan = A->nan;
        fix_float(r);
        break;
      case Op::Floor: r.flo = std::floor(A->flo); r.fhi = std::floor(A->fhi); r.nan = A->nan; break;
      case Op::ToInt:  // monotone; NaN converts to 0
        r.ilo = float_to_int(A->flo);
        r.ihi = float_to_int(A->fhi);
        if (A->nan) { r.ilo = std::min<int64_t>(r.ilo, 0); r.ihi = std::max<int64_t>(r.ihi, 0); }
        r.ilo = sat(r.ilo);
        r.ihi = sat(r.ihi);
        break;
    }
    regs[k] = r;
  }
}

}  // namespace

Interval eval_interval(const Program& p, int64_t bi, int64_t hi, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                       std::vector<Interval>& regs) {
  eval_box(p, Box{{bi, hi, q0, k0}, {bi, hi, q1, k1}}, true, regs);
  return regs[p.result];
}

namespace {

// The int instructions whose values lie in [-bound, bound] for every b, h, q, kv within the narrow
// bounds (and any captured-tensor values).
std::vector<bool> ints_within(const Program& p, int64_t bound) {
  std::vector<Interval> regs;
  eval_box(p, Box{{0, 0, 0, 0}, {kNarrowBH - 1, kNarrowBH - 1, kNarrowQKv - 1, kNarrowQKv - 1}}, false, regs);
  std::vector<bool> fits(p.code.size(), false);
  for (size_t k = 0; k < p.code.size(); ++k)
    fits[k] = p.code[k].kind == Kind::Int && regs[k].ilo >= -bound && regs[k].ihi <= bound;
  return fits;
}

}  // namespace

// INT32_MIN left out: then negation, abs and division of an int local never overflow.
std::vector<bool> int32_instructions(const Program& p) { return ints_within(p, std::numeric_limits<int32_t>::max()); }

std::vector<bool> small_int_instructions(const Program& p) { return ints_within(p, int64_t{1} << 22); }

bool loads_in_bounds(const Program& p, int64_t B, int64_t H, int64_t L, int64_t S) {
  if (!p.reads_tensors) return true;
  std::vector<Interval> regs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      eval_interval(p, b, h, 0, L - 1, 0, S - 1, regs);
      for (const Instr& in : p.code) {
        if (in.op != Op::Load) continue;
        const int32_t ops[3] = {in.a, in.b, in.c};
        for (int d = 0; d < in.nidx; ++d) {
          const Interval& x = regs[ops[d]];
          if (x.ilo < 0 || x.ihi >= p.buffers[in.buf].sizes[d]) return false;
        }
      }
    }
  return true;
}

}  // namespace kiln::flex::detail
