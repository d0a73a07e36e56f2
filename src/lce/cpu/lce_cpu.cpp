// CPU fused linear cross-entropy. Logits exist only as fp32 (fp64 for fp64 inputs) tiles:
//   memory forward:  for each token chunk, for each vocabulary tile: tile = x_c W_t^T (OpenBLAS via
//                    cpu::gemm), one row pass (bias, soft-cap, max, weighted sum) and a sum-exp
//                    pass merged into an online logsumexp per row. Keeps lse [N] only.
//   memory backward: for each vocabulary tile (outer), for each token chunk: recompute the tile,
//                    turn it into dL/dz in place (one pass), dx_acc += dz W_t, dW_t += dz^T x_c
//                    (fixed chunk order), then write the dW_t slice once. Never a [V, H] fp32 buffer.
//   speed forward:   for each token chunk: the [chunk, V] logits, the row statistics, dz in place,
//                    dx_c = dz W and dW += dz^T x_c: three GEMMs, gradients for an upstream 1.
// bf16/fp16 operands are converted to fp32 panels per chunk/tile (never a whole fp32 copy of x or
// W in the memory strategy). Threads: the GEMMs split C into fixed tiles (cpu::gemm) and the row
// passes run rows in parallel, each row on one thread, so results do not depend on thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "kiln/autograd.h"
#include "lce/cpu/lce_rows.h"
#include "lce/lce_internal.h"
#include "ops/cpu/gemm.h"

namespace kiln::cpu {
namespace {

using lce::Consts;
using lce::Totals;

// Row passes run in parallel only when a tile carries enough work to wake the team.
constexpr int64_t kParallelElems = int64_t{1} << 14;

template <typename A>
Totals<A> totals(const lce::Problem& p, const A* cw) {
  const Consts& k = p.k;
  const int64_t* y = p.target.data_ptr<int64_t>();
  Totals<A> t;
  double ws = 0, cnt = 0, cs = 0;
  for (int64_t i = 0; i < k.n; ++i) {
    if (lce::is_ignored(y[i], k)) continue;
    KILN_CHECK(y[i] >= 0 && y[i] < k.v, "linear_cross_entropy", "target ", y[i], " at position ", i,
               " is out of range for ", k.v, " classes (ignore_index is ", k.ignore_index, ")");
    ws += cw ? static_cast<double>(cw[y[i]]) : 1.0;
    cnt += 1;
  }
  if (cw) {
    for (int64_t j = 0; j < k.v; ++j) cs += static_cast<double>(cw[j]);
  } else {
    cs = static_cast<double>(k.v);
  }
  t.weight_sum = static_cast<A>(ws);
  t.count = static_cast<A>(cnt);
  t.class_sum = static_cast<A>(cs);
  return t;
}

// rows x cols block of a [*, ld] T matrix starting at row r0, as an A panel (no copy when T == A).
template <typename T, typename A>
const A* panel(const T* src, int64_t r0, int64_t rows, int64_t cols, Tensor& buf) {
  if constexpr (std::is_same_v<T, A>) {
    (void)rows;
    (void)buf;
    return src + r0 * cols;
  } else {
    A* out = buf.data_ptr<A>();
    const T* in = src + r0 * cols;
    const int64_t total = rows * cols;
#pragma omp parallel for schedule(static) if (total >= kParallelElems)
    for (int64_t i = 0; i < total; ++i) out[i] = static_cast<A>(static_cast<float>(in[i]));
    return out;
  }
}

template <typename T, typename A>
void store(const A* src, T* dst, int64_t total) {
#pragma omp parallel for schedule(static) if (total >= kParallelElems)
  for (int64_t i = 0; i < total; ++i) dst[i] = cast_value<T>(src[i]);
}

template <typename A>
Tensor buffer(const Shape& shape, bool needed) {
  return needed ? empty(shape, dtype_of<A>::value) : Tensor();
}

// Final loss / z-loss outputs (acc dtype) from per-token terms (fixed sequential order, double sums).
template <typename A>
void reduce_outputs(const lce::Problem& p, const Totals<A>& tot, const A* loss_tok, const A* z_tok, lce::Forward& f) {
  const Consts& k = p.k;
  const DType acc = dtype_of<A>::value;
  if (k.red == lce::Red::None) {
    f.loss = empty({k.n}, acc);
    f.zterm = empty({k.n}, acc);
    A* l = f.loss.data_ptr<A>();
    A* z = f.zterm.data_ptr<A>();
    for (int64_t i = 0; i < k.n; ++i) {
      l[i] = loss_tok[i] + z_tok[i];
      z[i] = z_tok[i];
    }
    return;
  }
  double ls = 0, zs = 0;
  for (int64_t i = 0; i < k.n; ++i) {
    ls += static_cast<double>(loss_tok[i]);
    zs += static_cast<double>(z_tok[i]);
  }
  if (k.red == lce::Red::Mean) {
    ls /= static_cast<double>(tot.weight_sum);  // 0 / 0 = NaN when every target is ignored
    zs /= static_cast<double>(tot.count);
  }
  const double loss = ls + (k.z_coef != 0.0 ? zs : 0.0);
  f.loss = empty({}, acc);
  f.loss.data_ptr<A>()[0] = static_cast<A>(loss);
  f.zterm = empty({}, acc);
  f.zterm.data_ptr<A>()[0] = static_cast<A>(k.z_coef != 0.0 ? zs : 0.0);
}

// The first column of a prepared row z[0..n) holding its maximum m (0 when none does: NaN logits).
template <typename A>
int64_t first_max(const A* z, int64_t n, A m) {
  for (int64_t j = 0; j < n; ++j)
    if (z[j] == m) return j;
  return 0;
}

// The per-token outputs beside the loss: the predicted token and, under token scaling, the
// detached p(target) that multiplies the token's terms (and later its gradient).
template <typename A>
void finish_extras(const lce::Problem& p, lce::Forward& f, int64_t i, int64_t argmax, A lse, A s_y, A* loss_tok,
                   A* z_tok) {
  const bool ignored = lce::is_ignored(p.target.data_ptr<int64_t>()[i], p.k);
  if (p.k.argmax) f.predicted.data_ptr<int64_t>()[i] = ignored ? -1 : argmax;
  if (p.k.token_scaling) {
    const A sc = ignored ? A(0) : std::exp(s_y - lse);
    f.tscale.data_ptr<A>()[i] = sc;
    loss_tok[i] *= sc;
    z_tok[i] *= sc;
  }
}

template <typename A>
void alloc_extras(const lce::Problem& p, lce::Forward& f) {
  if (p.k.argmax) f.predicted = empty({p.k.n}, kInt64);
  if (p.k.token_scaling) f.tscale = empty({p.k.n}, dtype_of<A>::value);
}

template <typename A>
A softcap_scalar(A z, A cap) {
  return cap > 0 ? cap * std::tanh(z / cap) : z;
}

template <typename T, typename A>
lce::Forward forward_memory(const lce::Problem& p) {
  const Consts& k = p.k;
  const int64_t N = k.n, H = k.h, V = k.v, Nc = p.plan.chunk_n, Vc = p.plan.chunk_v;
  constexpr bool kConvert = !std::is_same_v<T, A>;
  const A* cw = p.class_weight.defined() ? p.class_weight.data_ptr<A>() : nullptr;
  const Totals<A> tot = totals<A>(p, cw);
  const T* x = p.x.data_ptr<T>();
  const T* w = p.w.data_ptr<T>();
  const T* bias = p.bias.defined() ? p.bias.data_ptr<T>() : nullptr;
  const int64_t* y = p.target.data_ptr<int64_t>();
  const A cap = static_cast<A>(k.softcap);

  Tensor tile = empty({Nc, Vc}, dtype_of<A>::value);
  Tensor xbuf = buffer<A>({Nc, H}, kConvert), wbuf = buffer<A>({Vc, H}, kConvert);
  Tensor bbuf = buffer<A>({Vc}, bias != nullptr && kConvert);
  Tensor state = empty({4, Nc}, dtype_of<A>::value);  // running max, sum, target logit, weighted sum
  Tensor terms = empty({2, std::max<int64_t>(N, 1)}, dtype_of<A>::value);  // loss_n, z_n
  std::vector<int64_t> amax(static_cast<size_t>(k.argmax ? Nc : 0));     // running argmax per row
  lce::Forward f;
  f.lse = empty({N}, dtype_of<A>::value);
  alloc_extras<A>(p, f);
  A* lse = f.lse.data_ptr<A>();
  A *m = state.data_ptr<A>(), *s = m + Nc, *sy = s + Nc, *ws = sy + Nc;
  A *loss_tok = terms.data_ptr<A>(), *z_tok = loss_tok + std::max<int64_t>(N, 1);
  A* t = tile.data_ptr<A>();

  for (int64_t n0 = 0; n0 < N; n0 += Nc) {
    const int64_t rows = std::min(Nc, N - n0);
    const A* xp = panel<T, A>(x, n0, rows, H, xbuf);
    std::fill(m, m + rows, static_cast<A>(-INFINITY));
    std::fill(s, s + rows, A(0));
    std::fill(sy, sy + rows, A(0));
    std::fill(ws, ws + rows, A(0));
    for (int64_t v0 = 0; v0 < V; v0 += Vc) {
      const int64_t cols = std::min(Vc, V - v0);
      const A* wp = panel<T, A>(w, v0, cols, H, wbuf);
      const A* bp = bias ? panel<T, A>(bias + v0, 0, 1, cols, bbuf) : nullptr;
      const A* cwt = cw ? cw + v0 : nullptr;
      gemm(false, true, rows, cols, H, A(1), xp, H, wp, H, A(0), t, cols);
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElems)
      for (int64_t r = 0; r < rows; ++r) {
        A* z = t + r * cols;
        A wsr = 0;
        const A mt = lce::rows::prep_max(z, cols, bp, cap, cwt, k.eps != 0.0 ? &wsr : nullptr);
        if (k.argmax && (v0 == 0 || mt > m[r])) amax[r] = v0 + first_max(z, cols, mt);  // ties: the earlier tile
        const A st = lce::rows::sum_exp(z, cols, mt);
        lce::lse_merge(m[r], s[r], mt, st, [](A e) { return std::exp(e); });
        const int64_t yy = y[n0 + r];
        if (yy >= v0 && yy < v0 + cols) sy[r] = z[yy - v0];
        ws[r] += wsr;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = n0 + r;
      const A l = m[r] + std::log(s[r]);
      lse[i] = l;
      if (lce::is_ignored(y[i], k)) {
        loss_tok[i] = z_tok[i] = 0;
      } else {
        const A wy = cw ? cw[y[i]] : A(1);
        loss_tok[i] = lce::token_loss<A>(l, sy[r], wy, ws[r], tot.class_sum, k);
        z_tok[i] = static_cast<A>(k.z_coef) * l * l;
      }
      finish_extras<A>(p, f, i, k.argmax ? amax[r] : 0, l, sy[r], loss_tok, z_tok);
    }
  }
  reduce_outputs<A>(p, tot, loss_tok, z_tok, f);
  return f;
}

// dL/dz for one tile row in place (z raw logits without bias when raw, else soft-capped s).
template <typename A>
void grad_row(A* z, int64_t cols, int64_t v0, int64_t yy, const A* bp, A cap, bool raw, A lse,
              const lce::CoefT<A>& c, const A* cwt) {
  const bool hit = yy >= v0 && yy < v0 + cols;
  A fy = 1;
  if (hit && cap > 0) {
    const A sy = raw ? softcap_scalar<A>(z[yy - v0] + (bp ? bp[yy - v0] : A(0)), cap) : z[yy - v0];
    fy = A(1) - (sy / cap) * (sy / cap);
  }
  lce::rows::grad(z, cols, bp, cap, raw, lse, c.a, c.c, cwt);
  if (hit) z[yy - v0] -= c.b * fy;
}

template <typename A>
lce::CoefT<A> coef_of(const lce::Problem& p, const Totals<A>& tot, const A* cw, int64_t yy, A g_up, A lse) {
  if (lce::is_ignored(yy, p.k)) return {};
  A g, gz;
  lce::token_scales<A>(g_up, tot, p.k, g, gz);
  return lce::row_coef<A>(g, gz, lse, cw ? cw[yy] : A(1), tot.class_sum, p.k);
}

// Column sums of a rows x cols tile added into acc (columns split over threads, rows in order).
template <typename A>
void add_column_sums(const A* t, int64_t rows, int64_t cols, A* acc) {
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElems)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t j0 = b * kBlock, j1 = std::min(cols, j0 + kBlock);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = j0; j < j1; ++j) acc[j] += t[r * cols + j];
  }
}

template <typename T, typename A>
lce::Grads backward_memory(const lce::Problem& p, const Tensor& lse_t, const Tensor& tscale_t, const Tensor& grad_t,
                           const lce::Needs& nd) {
  const Consts& k = p.k;
  const int64_t N = k.n, H = k.h, V = k.v, Nc = p.plan.chunk_n, Vc = p.plan.chunk_v;
  constexpr bool kConvert = !std::is_same_v<T, A>;
  const A* cw = p.class_weight.defined() ? p.class_weight.data_ptr<A>() : nullptr;
  const Totals<A> tot = totals<A>(p, cw);
  const T* x = p.x.data_ptr<T>();
  const T* w = p.w.data_ptr<T>();
  const T* bias = p.bias.defined() ? p.bias.data_ptr<T>() : nullptr;
  const int64_t* y = p.target.data_ptr<int64_t>();
  const A* lse = lse_t.data_ptr<A>();
  const A* gup = grad_t.data_ptr<A>();
  const A* tscale = tscale_t.defined() ? tscale_t.data_ptr<A>() : nullptr;
  const bool per_token = k.red == lce::Red::None;
  const A cap = static_cast<A>(k.softcap);
  const DType acc = dtype_of<A>::value;

  lce::Grads out;
  // dx accumulates over vocabulary tiles: directly in dx for fp32/fp64, else in one fp32 [N, H].
  Tensor dx_acc;
  if (nd.dx) {
    out.dx = zeros({N, H}, p.x.options());
    dx_acc = kConvert ? zeros({N, H}, acc) : out.dx;
  }
  if (nd.dw) out.dw = zeros({V, H}, p.w.options());
  if (nd.db) out.db = zeros({V}, p.w.options());
  if (N == 0) return out;

  Tensor coef = empty({N, 3}, acc);
  A* cf = coef.data_ptr<A>();
  for (int64_t i = 0; i < N; ++i) {
    const A g_up = gup[per_token ? i : 0] * (tscale ? tscale[i] : A(1));
    const lce::CoefT<A> c = coef_of<A>(p, tot, cw, y[i], g_up, lse[i]);
    cf[3 * i] = c.a;
    cf[3 * i + 1] = c.b;
    cf[3 * i + 2] = c.c;
  }
  Tensor tile = empty({Nc, Vc}, acc);
  Tensor xbuf = buffer<A>({Nc, H}, kConvert), wbuf = buffer<A>({Vc, H}, kConvert);
  Tensor bbuf = buffer<A>({Vc}, bias != nullptr && kConvert);
  Tensor dwt = buffer<A>({Vc, H}, nd.dw && kConvert);
  Tensor dbt = buffer<A>({Vc}, nd.db);
  A* t = tile.data_ptr<A>();

  for (int64_t v0 = 0; v0 < V; v0 += Vc) {
    const int64_t cols = std::min(Vc, V - v0);
    const A* wp = panel<T, A>(w, v0, cols, H, wbuf);
    const A* bp = bias ? panel<T, A>(bias + v0, 0, 1, cols, bbuf) : nullptr;
    const A* cwt = cw ? cw + v0 : nullptr;
    A* dw_slice = nullptr;
    if (nd.dw) dw_slice = kConvert ? dwt.data_ptr<A>() : reinterpret_cast<A*>(out.dw.data_ptr<T>() + v0 * H);
    if (nd.db) std::fill(dbt.data_ptr<A>(), dbt.data_ptr<A>() + cols, A(0));
    for (int64_t n0 = 0; n0 < N; n0 += Nc) {
      const int64_t rows = std::min(Nc, N - n0);
      const A* xp = panel<T, A>(x, n0, rows, H, xbuf);
      gemm(false, true, rows, cols, H, A(1), xp, H, wp, H, A(0), t, cols);
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElems)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = n0 + r;
        A* z = t + r * cols;
        if (lce::is_ignored(y[i], k)) {
          std::fill(z, z + cols, A(0));
          continue;
        }
        const lce::CoefT<A> c{cf[3 * i], cf[3 * i + 1], cf[3 * i + 2]};
        grad_row<A>(z, cols, v0, y[i], bp, cap, /*raw=*/true, lse[i], c, cwt);
      }
      if (nd.dx) gemm(false, false, rows, H, cols, A(1), t, cols, wp, H, A(1), dx_acc.data_ptr<A>() + n0 * H, H);
      if (nd.dw) gemm(true, false, cols, H, rows, A(1), t, cols, xp, H, n0 == 0 ? A(0) : A(1), dw_slice, H);
      if (nd.db) add_column_sums<A>(t, rows, cols, dbt.data_ptr<A>());
    }
    if (nd.dw && kConvert) store<T, A>(dw_slice, out.dw.data_ptr<T>() + v0 * H, cols * H);
    if (nd.db) store<T, A>(dbt.data_ptr<A>(), out.db.data_ptr<T>() + v0, cols);
  }
  if (nd.dx && kConvert) store<T, A>(dx_acc.data_ptr<A>(), out.dx.data_ptr<T>(), N * H);
  return out;
}

template <typename T, typename A>
lce::Forward forward_speed(const lce::Problem& p, const lce::Needs& nd) {
  const Consts& k = p.k;
  const int64_t N = k.n, H = k.h, V = k.v, Nc = p.plan.chunk_n;
  // bf16/fp16 W is converted one vocabulary tile at a time (its fp32 copy would be V x H).
  const int64_t Vt = p.plan.chunk_v;
  constexpr bool kConvert = !std::is_same_v<T, A>;
  const DType acc = dtype_of<A>::value;
  const A* cw = p.class_weight.defined() ? p.class_weight.data_ptr<A>() : nullptr;
  const Totals<A> tot = totals<A>(p, cw);
  const T* x = p.x.data_ptr<T>();
  const T* w = p.w.data_ptr<T>();
  const int64_t* y = p.target.data_ptr<int64_t>();
  const A cap = static_cast<A>(k.softcap);

  lce::Forward f;
  f.lse = empty({N}, acc);
  alloc_extras<A>(p, f);
  if (nd.dx) f.dx = empty({N, H}, p.x.options());
  if (nd.dw) f.dw = zeros({V, H}, p.w.options());
  if (nd.db) f.db = zeros({V}, p.w.options());
  Tensor bias_a = p.bias.defined() ? p.bias.to(acc) : Tensor();  // [V], only in this strategy
  const A* bp = bias_a.defined() ? bias_a.data_ptr<A>() : nullptr;
  Tensor logits = empty({Nc, V}, acc);
  Tensor xbuf = buffer<A>({Nc, H}, kConvert), wbuf = buffer<A>({Vt, H}, kConvert);
  Tensor dx_c = buffer<A>({Nc, H}, nd.dx && kConvert);
  Tensor dw_acc = buffer<A>({V, H}, nd.dw && kConvert);
  if (dw_acc.defined()) dw_acc.zero_();
  Tensor db_acc = buffer<A>({V}, nd.db);
  if (nd.db) db_acc.zero_();
  Tensor terms = empty({4, std::max<int64_t>(N, 1)}, acc);
  A* lse = f.lse.data_ptr<A>();
  A *loss_tok = terms.data_ptr<A>(), *z_tok = loss_tok + std::max<int64_t>(N, 1);
  A* zt = logits.data_ptr<A>();
  A* dw_base = nd.dw ? (kConvert ? dw_acc.data_ptr<A>() : reinterpret_cast<A*>(f.dw.data_ptr<T>())) : nullptr;

  for (int64_t n0 = 0; n0 < N; n0 += Nc) {
    const int64_t rows = std::min(Nc, N - n0);
    const A* xp = panel<T, A>(x, n0, rows, H, xbuf);
    for (int64_t v0 = 0; v0 < V; v0 += Vt) {
      const int64_t cols = std::min(Vt, V - v0);
      const A* wp = panel<T, A>(w, v0, cols, H, wbuf);
      gemm(false, true, rows, cols, H, A(1), xp, H, wp, H, A(0), zt + v0, V);
    }
#pragma omp parallel for schedule(static) if (rows * V >= kParallelElems)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = n0 + r, yy = y[i];
      A* z = zt + r * V;
      A ws = 0;
      const A mx = lce::rows::prep_max(z, V, bp, cap, cw, k.eps != 0.0 ? &ws : nullptr);
      const int64_t am = k.argmax ? first_max(z, V, mx) : 0;
      const A l = mx + std::log(lce::rows::sum_exp(z, V, mx));
      lse[i] = l;
      if (lce::is_ignored(yy, k)) {
        loss_tok[i] = z_tok[i] = 0;
        finish_extras<A>(p, f, i, am, l, A(0), loss_tok, z_tok);
        std::fill(z, z + V, A(0));
        continue;
      }
      const A wy = cw ? cw[yy] : A(1);
      loss_tok[i] = lce::token_loss<A>(l, z[yy], wy, ws, tot.class_sum, k);
      z_tok[i] = static_cast<A>(k.z_coef) * l * l;
      finish_extras<A>(p, f, i, am, l, z[yy], loss_tok, z_tok);
      const A g_up = k.token_scaling ? f.tscale.data_ptr<A>()[i] : A(1);
      grad_row<A>(z, V, 0, yy, bp, cap, /*raw=*/false, l, coef_of<A>(p, tot, cw, yy, g_up, l), cw);
    }
    for (int64_t v0 = 0; v0 < V; v0 += Vt) {  // dx_c = dz W (over V tiles), dW += dz^T x_c
      const int64_t cols = std::min(Vt, V - v0);
      const A* wp = panel<T, A>(w, v0, cols, H, wbuf);
      if (nd.dx) {
        A* dxp = kConvert ? dx_c.data_ptr<A>() : reinterpret_cast<A*>(f.dx.data_ptr<T>() + n0 * H);
        gemm(false, false, rows, H, cols, A(1), zt + v0, V, wp, H, v0 == 0 ? A(0) : A(1), dxp, H);
      }
      if (nd.dw) gemm(true, false, cols, H, rows, A(1), zt + v0, V, xp, H, A(1), dw_base + v0 * H, H);
    }
    if (nd.dx && kConvert) store<T, A>(dx_c.data_ptr<A>(), f.dx.data_ptr<T>() + n0 * H, rows * H);
    if (nd.db) add_column_sums<A>(zt, rows, V, db_acc.data_ptr<A>());
  }
  if (nd.dw && kConvert) store<T, A>(dw_acc.data_ptr<A>(), f.dw.data_ptr<T>(), V * H);
  if (nd.db) store<T, A>(db_acc.data_ptr<A>(), f.db.data_ptr<T>(), V);
  if (nd.dx && N == 0) f.dx.zero_();
  reduce_outputs<A>(p, tot, loss_tok, z_tok, f);
  return f;
}

template <typename F>
decltype(auto) dispatch(DType dt, F&& fn) {
  return dispatch_floating(dt, "linear_cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    return fn(TypeTag<T>{}, TypeTag<A>{});
  });
}

}  // namespace

lce::Forward lce_forward_memory(const lce::Problem& p) {
  NoGradGuard ng;
  return dispatch(p.x.dtype(), [&](auto t, auto a) {
    return forward_memory<typename decltype(t)::type, typename decltype(a)::type>(p);
  });
}

lce::Forward lce_forward_speed(const lce::Problem& p, const lce::Needs& needs) {
  NoGradGuard ng;
  return dispatch(p.x.dtype(), [&](auto t, auto a) {
    return forward_speed<typename decltype(t)::type, typename decltype(a)::type>(p, needs);
  });
}

lce::Grads lce_backward_memory(const lce::Problem& p, const Tensor& lse, const Tensor& tscale, const Tensor& grad,
                               const lce::Needs& needs) {
  NoGradGuard ng;
  return dispatch(p.x.dtype(), [&](auto t, auto a) {
    return backward_memory<typename decltype(t)::type, typename decltype(a)::type>(p, lse, tscale, grad, needs);
  });
}

}  // namespace kiln::cpu
