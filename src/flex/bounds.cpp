// The host-side proof that a mask_mod reads its captured tensors in range over the whole
// (b, h, q, kv) domain. Interval analysis decides most boxes at once; a box whose load indices
// may leave their tensor is split in halves along its longer side until it is small, then
// evaluated exactly, so an imprecise interval never raises and a real out-of-range read always
// does (block classification alone may decide a block from clamped loads without reading them).
#include <algorithm>
#include <sstream>

#include "flex/ir.h"

namespace kiln::flex::detail {
namespace {

constexpr int64_t kDenseBox = 4096;  // positions evaluated exactly once a box is this small

struct LoadChecker {
  const Program& p;
  int64_t b = 0, h = 0;
  std::vector<Interval> regs;
  RowEval<double> dense;
  std::vector<double> zero_scores;

  LoadChecker(const Program& prog, int64_t S)
      : p(prog), dense(prog, std::min(S, kDenseBox)), zero_scores(static_cast<size_t>(std::min(S, kDenseBox)), 0.0) {}

  // True when interval analysis proves every load index in range over the box.
  bool proven(int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    eval_interval(p, b, h, q0, q1, k0, k1, regs);
    for (const Instr& in : p.code) {
      if (in.op != Op::Load) continue;
      const int32_t ops[3] = {in.a, in.b, in.c};
      for (int d = 0; d < in.nidx; ++d)
        if (regs[ops[d]].ilo < 0 || regs[ops[d]].ihi >= p.buffers[in.buf].sizes[d]) return false;
    }
    return true;
  }

  // The first out-of-range read in the box, with its q (false: none).
  bool find(int64_t q0, int64_t q1, int64_t k0, int64_t k1, RowEval<double>::IndexFault& fault, int64_t& fq) {
    if (proven(q0, q1, k0, k1)) return false;
    const int64_t nq = q1 - q0 + 1, nk = k1 - k0 + 1;
    if (nq * nk <= kDenseBox) {
      for (int64_t q = q0; q <= q1; ++q) {
        dense.run(b, h, q, k0, nk, zero_scores.data());
        if (dense.index_error()) {
          fault = dense.index_fault();
          fq = q;
          return true;
        }
      }
      return false;
    }
    if (nq >= nk) {
      const int64_t mid = q0 + nq / 2;
      return find(q0, mid - 1, k0, k1, fault, fq) || find(mid, q1, k0, k1, fault, fq);
    }
    const int64_t mid = k0 + nk / 2;
    return find(q0, q1, k0, mid - 1, fault, fq) || find(q0, q1, mid, k1, fault, fq);
  }
};

bool reads(const Program& p, Op op) {
  return std::any_of(p.code.begin(), p.code.end(), [op](const Instr& in) { return in.op == op; });
}

}  // namespace

void check_mask_loads(const Program& p, const Expr& e, const char* op, int64_t B, int64_t H, int64_t L, int64_t S) {
  if (!p.reads_tensors) return;
  LoadChecker c(p, S);
  // Only the (b, h) the mask can tell apart.
  const int64_t Bc = reads(p, Op::B) ? B : 1, Hc = reads(p, Op::H) ? H : 1;
  for (c.b = 0; c.b < Bc; ++c.b)
    for (c.h = 0; c.h < Hc; ++c.h) {
      RowEval<double>::IndexFault f;
      int64_t fq = 0;
      if (!c.find(0, L - 1, 0, S - 1, f, fq)) continue;
      // The span of the faulting index over the whole (q, kv) domain of this b, h.
      c.proven(0, L - 1, 0, S - 1);
      int32_t index_instr = -1;
      for (const Instr& in : p.code)
        if (in.op == Op::Load && in.buf == f.buf && index_instr < 0) {
          const int32_t ops[3] = {in.a, in.b, in.c};
          const Interval& x = c.regs[ops[f.dim]];
          if (x.ilo < 0 || x.ihi >= p.buffers[in.buf].sizes[f.dim]) index_instr = ops[f.dim];
        }
      const Buffer& buf = p.buffers[f.buf];
      std::ostringstream shape;
      for (int d = 0; d < buf.ndim; ++d) shape << (d ? ", " : "[") << buf.sizes[d];
      shape << "]";
      std::ostringstream span;
      if (index_instr >= 0) span << "; over Q_LEN " << L << ", KV_LEN " << S << " that index spans ["
                                 << c.regs[index_instr].ilo << ", " << c.regs[index_instr].ihi << "]";
      KILN_FAIL(op, "mask_mod reads captured tensor buf", captured_number(e, buf.src.get()), " (shape ", shape.str(),
                ") out of range: index ", f.index, " along dim ", f.dim, " (valid 0..", buf.sizes[f.dim] - 1,
                ") at b=", c.b, ", h=", c.h, ", q_idx=", fq, ", kv_idx=", f.kv, span.str(), "; mask_mod: ",
                to_string(e));
    }
}

}  // namespace kiln::flex::detail
