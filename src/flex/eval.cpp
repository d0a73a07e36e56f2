// Row evaluator of a compiled mod: one query row against n kv positions. Each instruction is a
// tight loop over n-element arrays (auto-vectorised), so the cost per element is a few cycles per
// instruction rather than a tree walk per element. The reverse pass differentiates a score_mod.
#include <algorithm>
#include <cmath>

#include "flex/ir.h"

namespace kiln::flex::detail {

template <typename F>
RowEval<F>::RowEval(const Program& p, int64_t max_n) : prog_(&p), max_n_(max_n) {
  int64_t ni = 0, nf = 0, nb = 0;
  off_.resize(p.code.size());
  for (size_t i = 0; i < p.code.size(); ++i) {
    switch (p.code[i].kind) {
      case Kind::Int: off_[i] = (ni++) * max_n; break;
      case Kind::Float: off_[i] = (nf++) * max_n; break;
      case Kind::Bool: off_[i] = (nb++) * max_n; break;
    }
  }
  iregs_.resize(static_cast<size_t>(ni * max_n));
  fregs_.resize(static_cast<size_t>(nf * max_n));
  bregs_.resize(static_cast<size_t>(nb * max_n));
  if (p.uses_score || p.any_grad) adj_.resize(fregs_.size());
}

namespace {

inline int64_t floor_div(int64_t x, int64_t y) {
  if (y == 0) return 0;  // defined (and documented by tests) rather than a crash
  int64_t q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}
inline int64_t floor_mod(int64_t x, int64_t y) { return y == 0 ? 0 : x - floor_div(x, y) * y; }
template <typename F>
inline F sign_of(F x) { return x > F(0) ? F(1) : x < F(0) ? F(-1) : x; }  // keeps NaN

}  // namespace

template <typename F>
void RowEval<F>::run(int64_t bi, int64_t hi, int64_t qi, int64_t kv0, int64_t n, const F* score) {
  n_ = n;
  const std::vector<Instr>& code = prog_->code;
  for (size_t k = 0; k < code.size(); ++k) {
    const Instr& in = code[k];
    int64_t* I = iregs_.data() + off_[k];
    F* Fv = fregs_.data() + off_[k];
    uint8_t* Bv = bregs_.data() + off_[k];
    const int64_t* ia = in.a >= 0 ? iregs_.data() + off_[in.a] : nullptr;
    const int64_t* ib = in.b >= 0 ? iregs_.data() + off_[in.b] : nullptr;
    const F* fa = in.a >= 0 ? fregs_.data() + off_[in.a] : nullptr;
    const F* fb = in.b >= 0 ? fregs_.data() + off_[in.b] : nullptr;
    const uint8_t* ba = in.a >= 0 ? bregs_.data() + off_[in.a] : nullptr;
    const uint8_t* bb = in.b >= 0 ? bregs_.data() + off_[in.b] : nullptr;
    const Kind ak = in.a >= 0 ? code[in.a].kind : Kind::Int;
#define KILN_LOOP(expr) for (int64_t j = 0; j < n; ++j) expr
    switch (in.op) {
      case Op::Score: KILN_LOOP(Fv[j] = score[j]); break;
      case Op::B: KILN_LOOP(I[j] = bi); break;
      case Op::H: KILN_LOOP(I[j] = hi); break;
      case Op::QIdx: KILN_LOOP(I[j] = qi); break;
      case Op::KvIdx: KILN_LOOP(I[j] = kv0 + j); break;
      case Op::ConstInt: KILN_LOOP(I[j] = in.ival); break;
      case Op::ConstBool: KILN_LOOP(Bv[j] = static_cast<uint8_t>(in.ival)); break;
      case Op::ConstFloat: KILN_LOOP(Fv[j] = static_cast<F>(in.fval)); break;
      case Op::ToFloat: KILN_LOOP(Fv[j] = static_cast<F>(ia[j])); break;
      case Op::Load: {
        const Buffer& buf = prog_->buffers[in.buf];
        const int32_t idx_ops[3] = {in.a, in.b, in.c};
        bool bad = false;
        for (int64_t j = 0; j < n; ++j) {
          int64_t flat = 0;
          for (int d = 0; d < in.nidx; ++d) {
            int64_t x = iregs_[off_[idx_ops[d]] + j];
            if (x < 0 || x >= buf.sizes[d]) {
              if (fault_.buf < 0) fault_ = IndexFault{in.buf, d, x, kv0 + j};
              bad = true;
              x = std::clamp<int64_t>(x, 0, buf.sizes[d] - 1);
            }
            flat += x * buf.strides[d];
          }
          if (in.kind == Kind::Float) {
            if constexpr (std::is_same_v<F, float>) Fv[j] = buf.fvals[flat];
            else Fv[j] = buf.dvals[flat];
          } else if (in.kind == Kind::Int) {
            I[j] = buf.ivals[flat];
          } else {
            Bv[j] = buf.ivals[flat] != 0;
          }
        }
        if (bad) index_error_ = true;
        break;
      }
      case Op::Add:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = ia[j] + ib[j]); else KILN_LOOP(Fv[j] = fa[j] + fb[j]);
        break;
      case Op::Sub:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = ia[j] - ib[j]); else KILN_LOOP(Fv[j] = fa[j] - fb[j]);
        break;
      case Op::Mul:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = ia[j] * ib[j]); else KILN_LOOP(Fv[j] = fa[j] * fb[j]);
        break;
      case Op::Div:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = floor_div(ia[j], ib[j])); else KILN_LOOP(Fv[j] = fa[j] / fb[j]);
        break;
      case Op::Mod: KILN_LOOP(I[j] = floor_mod(ia[j], ib[j])); break;
      case Op::Neg:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = -ia[j]); else KILN_LOOP(Fv[j] = -fa[j]);
        break;
#define KILN_CMP(OPSYM)                                                   \
  if (ak == Kind::Int) KILN_LOOP(Bv[j] = ia[j] OPSYM ib[j]);              \
  else if (ak == Kind::Float) KILN_LOOP(Bv[j] = fa[j] OPSYM fb[j]);       \
  else KILN_LOOP(Bv[j] = ba[j] OPSYM bb[j]);                              \
  break;
      case Op::Lt: KILN_CMP(<)
      case Op::Le: KILN_CMP(<=)
      case Op::Gt: KILN_CMP(>)
      case Op::Ge: KILN_CMP(>=)
      case Op::Eq: KILN_CMP(==)
      case Op::Ne: KILN_CMP(!=)
#undef KILN_CMP
      case Op::And: KILN_LOOP(Bv[j] = ba[j] & bb[j]); break;
      case Op::Or: KILN_LOOP(Bv[j] = ba[j] | bb[j]); break;
      case Op::Not: KILN_LOOP(Bv[j] = ba[j] ^ 1); break;
      case Op::Where: {
        const uint8_t* c = bregs_.data() + off_[in.a];
        if (in.kind == Kind::Int) {
          const int64_t *x = iregs_.data() + off_[in.b], *y = iregs_.data() + off_[in.c];
          KILN_LOOP(I[j] = c[j] ? x[j] : y[j]);
        } else if (in.kind == Kind::Float) {
          const F *x = fregs_.data() + off_[in.b], *y = fregs_.data() + off_[in.c];
          KILN_LOOP(Fv[j] = c[j] ? x[j] : y[j]);
        } else {
          const uint8_t *x = bregs_.data() + off_[in.b], *y = bregs_.data() + off_[in.c];
          KILN_LOOP(Bv[j] = c[j] ? x[j] : y[j]);
        }
        break;
      }
      case Op::Min:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = std::min(ia[j], ib[j]));
        else KILN_LOOP(Fv[j] = fb[j] < fa[j] ? fb[j] : fa[j]);
        break;
      case Op::Max:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = std::max(ia[j], ib[j]));
        else KILN_LOOP(Fv[j] = fb[j] > fa[j] ? fb[j] : fa[j]);
        break;
      case Op::Abs:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = ia[j] < 0 ? -ia[j] : ia[j]); else KILN_LOOP(Fv[j] = std::fabs(fa[j]));
        break;
      case Op::Tanh: KILN_LOOP(Fv[j] = std::tanh(fa[j])); break;
      case Op::Exp: KILN_LOOP(Fv[j] = std::exp(fa[j])); break;
      case Op::Log: KILN_LOOP(Fv[j] = std::log(fa[j])); break;
      case Op::Sign:
        if (in.kind == Kind::Int) KILN_LOOP(I[j] = (ia[j] > 0) - (ia[j] < 0)); else KILN_LOOP(Fv[j] = sign_of(fa[j]));
        break;
      case Op::Sigmoid: KILN_LOOP(Fv[j] = F(1) / (F(1) + std::exp(-fa[j]))); break;
      case Op::Floor: KILN_LOOP(Fv[j] = std::floor(fa[j])); break;
      case Op::ToInt: KILN_LOOP(I[j] = float_to_int(fa[j])); break;
    }
#undef KILN_LOOP
  }
}

template <typename F>
void RowEval<F>::backward(const F* dresult, F* dscore, std::vector<std::vector<double>>& grads) {
  const std::vector<Instr>& code = prog_->code;
  const int64_t n = n_;
  for (size_t k = 0; k < code.size(); ++k)
    if (code[k].needs_adj) std::fill_n(adj_.data() + off_[k], n, F(0));
  if (dscore) std::fill_n(dscore, n, F(0));
  if (!code[prog_->result].needs_adj) return;
  std::copy_n(dresult, n, adj_.data() + off_[prog_->result]);
  for (size_t k = code.size(); k-- > 0;) {
    const Instr& in = code[k];
    if (!in.needs_adj) continue;
    const F* g = adj_.data() + off_[k];
    const F* y = fregs_.data() + off_[k];
    F* da = in.a >= 0 && code[in.a].needs_adj ? adj_.data() + off_[in.a] : nullptr;
    F* db = in.b >= 0 && code[in.b].needs_adj ? adj_.data() + off_[in.b] : nullptr;
    F* dc = in.c >= 0 && code[in.c].needs_adj ? adj_.data() + off_[in.c] : nullptr;
    const F* fa = in.a >= 0 ? fregs_.data() + off_[in.a] : nullptr;
    const F* fb = in.b >= 0 ? fregs_.data() + off_[in.b] : nullptr;
    switch (in.op) {
      case Op::Score:
        if (dscore)
          for (int64_t j = 0; j < n; ++j) dscore[j] += g[j];
        break;
      case Op::Load: {
        const Buffer& buf = prog_->buffers[in.buf];
        if (!buf.needs_grad) break;
        if (grads.size() <= static_cast<size_t>(in.buf) || grads[in.buf].empty()) break;  // not wanted here
        std::vector<double>& G = grads[in.buf];
        const int32_t idx_ops[3] = {in.a, in.b, in.c};
        for (int64_t j = 0; j < n; ++j) {
          int64_t flat = 0;
          for (int d = 0; d < in.nidx; ++d)
            flat += std::clamp<int64_t>(iregs_[off_[idx_ops[d]] + j], 0, buf.sizes[d] - 1) * buf.strides[d];
          G[flat] += static_cast<double>(g[j]);
        }
        break;
      }
      case Op::Add:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j];
        if (db) for (int64_t j = 0; j < n; ++j) db[j] += g[j];
        break;
      case Op::Sub:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j];
        if (db) for (int64_t j = 0; j < n; ++j) db[j] -= g[j];
        break;
      case Op::Mul:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j] * fb[j];
        if (db) for (int64_t j = 0; j < n; ++j) db[j] += g[j] * fa[j];
        break;
      case Op::Div:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j] / fb[j];
        if (db) for (int64_t j = 0; j < n; ++j) db[j] -= g[j] * y[j] / fb[j];
        break;
      case Op::Neg:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] -= g[j];
        break;
      case Op::Where: {
        const uint8_t* c = bregs_.data() + off_[in.a];
        if (db) for (int64_t j = 0; j < n; ++j) db[j] += c[j] ? g[j] : F(0);
        if (dc) for (int64_t j = 0; j < n; ++j) dc[j] += c[j] ? F(0) : g[j];
        break;
      }
      case Op::Min:  // ties go to the first operand, as the forward picks it
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += fb[j] < fa[j] ? F(0) : g[j];
        if (db) for (int64_t j = 0; j < n; ++j) db[j] += fb[j] < fa[j] ? g[j] : F(0);
        break;
      case Op::Max:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += fb[j] > fa[j] ? F(0) : g[j];
        if (db) for (int64_t j = 0; j < n; ++j) db[j] += fb[j] > fa[j] ? g[j] : F(0);
        break;
      case Op::Abs:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += fa[j] > 0 ? g[j] : fa[j] < 0 ? -g[j] : F(0);
        break;
      case Op::Tanh:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j] * (F(1) - y[j] * y[j]);
        break;
      case Op::Exp:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j] * y[j];
        break;
      case Op::Log:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j] / fa[j];
        break;
      case Op::Sigmoid:
        if (da) for (int64_t j = 0; j < n; ++j) da[j] += g[j] * y[j] * (F(1) - y[j]);
        break;
      default: break;  // sign, floor: flat  // constants, ToFloat: no float inputs
    }
  }
}

template class RowEval<float>;
template class RowEval<double>;

}  // namespace kiln::flex::detail
