// Unfused cross-entropy on the CPU: the reference the fused LinearCrossEntropy is checked
// against. Per row, pass 1 finds the max m, pass 2 sums exp(x - m) and w_c (m - x_c);
// lse = m + log(sum). The label-smoothing term sum_c w_c (lse - x_c) = (lse - m) W + sum_c w_c (m - x_c),
// both parts non-negative, so nothing cancels.
// Rows are independent (OpenMP); the final sum over rows runs in fp64 in row order, so the loss
// is bitwise identical for any thread count.
#include "ops/cpu/loss.h"

#include <cmath>
#include <limits>

#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {

void cross_entropy_rows(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                        double smoothing, const Tensor& lse, const Tensor& row_loss, const Tensor& row_weight) {
  const int64_t N = logits.size(0), C = logits.size(1);
  dispatch_index(target.dtype(), "cross_entropy", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* tp = target.data_ptr<I>();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = static_cast<int64_t>(tp[i]);
      KILN_CHECK(t == ignore_index || (t >= 0 && t < C), "cross_entropy", "target ", t, " at row ", i,
                 " is out of range for ", C, " classes");
    }
    dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      const T* xp = logits.data_ptr<T>();
      const A* wp = weight.defined() ? weight.data_ptr<A>() : nullptr;
      A* lp = lse.data_ptr<A>();
      A* rl = row_loss.data_ptr<A>();
      A* rw = row_weight.data_ptr<A>();
      const A eps = static_cast<A>(smoothing);
      const int nt = threads_for(N * C, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
      for (int64_t i = 0; i < N; ++i) {
        const T* x = xp + i * C;
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t c = 0; c < C; ++c) {
          const A v = static_cast<A>(x[c]);
          m = v > m ? v : m;
        }
        // gap = sum_c w_c (m - x_c) >= 0: no cancellation in the smoothing term.
        A s = 0, gap = 0, W = 0;
        if (m != -std::numeric_limits<A>::infinity()) {
          for (int64_t c = 0; c < C; ++c) {
            const A d = m - static_cast<A>(x[c]);
            const A w = wp ? wp[c] : A(1);
            s += std::exp(-d);
            gap += w * d;
            W += w;
          }
        }
        const A l = m + std::log(s);
        lp[i] = l;
        const int64_t t = static_cast<int64_t>(tp[i]);
        if (t == ignore_index) {
          rl[i] = 0;
          rw[i] = 0;
          continue;
        }
        const A wt = wp ? wp[t] : A(1);
        A loss = (A(1) - eps) * wt * (l - static_cast<A>(x[t]));
        if (eps != A(0)) loss += eps / static_cast<A>(C) * ((l - m) * W + gap);
        rl[i] = loss;
        rw[i] = wt;
      }
    });
  });
}

void cross_entropy_reduce(const Tensor& row_loss, const Tensor& row_weight, bool mean, const Tensor& out,
                          const Tensor& total_weight) {
  const int64_t N = row_loss.numel();
  dispatch_floating(row_loss.dtype(), "cross_entropy", [&](auto tag) {
    using A = typename decltype(tag)::type;
    const A* rl = row_loss.data_ptr<A>();
    const A* rw = row_weight.data_ptr<A>();
    double total = 0, wsum = 0;
    for (int64_t i = 0; i < N; ++i) {
      total += static_cast<double>(rl[i]);
      wsum += static_cast<double>(rw[i]);
    }
    if (mean) total /= wsum;  // all rows ignored: 0/0 = nan, as in PyTorch
    if (total_weight.defined()) total_weight.data_ptr<A>()[0] = static_cast<A>(wsum);
    dispatch_floating(out.dtype(), "cross_entropy", [&](auto otag) {
      using T = typename decltype(otag)::type;
      out.data_ptr<T>()[0] = cast_value<T>(total);
    });
  });
}

void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& weight,
                            const Tensor& lse, const Tensor& total_weight, int64_t ignore_index, double smoothing,
                            const Tensor& dlogits) {
  const int64_t N = logits.size(0), C = logits.size(1);
  dispatch_index(target.dtype(), "cross_entropy_backward", [&](auto itag) {
    using I = typename decltype(itag)::type;
    dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      const I* tp = target.data_ptr<I>();
      const T* xp = logits.data_ptr<T>();
      const T* gp = grad.data_ptr<T>();
      const int64_t gstride = grad.dim() == 0 ? 0 : 1;
      const A* wp = weight.defined() ? weight.data_ptr<A>() : nullptr;
      const A* lp = lse.data_ptr<A>();
      const A inv_total = total_weight.defined() ? A(1) / total_weight.data_ptr<A>()[0] : A(1);
      T* dp = dlogits.data_ptr<T>();
      const A eps = static_cast<A>(smoothing), eps_c = eps / static_cast<A>(C);
      A W = static_cast<A>(C);
      if (wp) {
        W = 0;
        for (int64_t c = 0; c < C; ++c) W += wp[c];
      }
      const int nt = threads_for(N * C, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
      for (int64_t i = 0; i < N; ++i) {
        T* d = dp + i * C;
        const int64_t t = static_cast<int64_t>(tp[i]);
        if (t == ignore_index) {
          for (int64_t c = 0; c < C; ++c) d[c] = T(0);
          continue;
        }
        const T* x = xp + i * C;
        const A scale = static_cast<A>(gp[i * gstride]) * inv_total;
        const A wt = wp ? wp[t] : A(1);
        const A l = lp[i];
        const A a = (A(1) - eps) * wt + eps_c * W;  // coefficient of p_c
        for (int64_t c = 0; c < C; ++c) {
          const A p = std::exp(static_cast<A>(x[c]) - l);
          A v = a * p - eps_c * (wp ? wp[c] : A(1));
          if (c == t) v -= (A(1) - eps) * wt;
          d[c] = T(scale * v);
        }
      }
    });
  });
}

}  // namespace kiln::cpu
