#pragma once
// The CUDA FlexAttention tests' harness: a problem's inputs drawn in the test dtype, run through
// flex_attention on the GPU and checked against the float64 dense reference (out, lse) and the float64
// CPU kernels (gradients), and the bitwise comparison of two runs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/flex.h"
#include "reference.h"
#include "support/testing.h"

namespace kiln::flex::testing {

inline const Device kGpu(DeviceType::CUDA, 0);

struct GpuCase {
  int64_t B = 1, Hq = 2, Hkv = 2, L = 200, S = 333, E = 64, bs = 128;
};

struct FlexRun {
  Tensor out, lse;
  std::vector<Tensor> grads;  // q, k, v, then `extra` (on the CPU, float64)
};

// flex_attention on `dev` from CPU inputs (converted to dtype dt), with grads for q, k, v and `extra`.
inline FlexRun run_on(Device dev, DType dt, const Tensor& q, const Tensor& k, const Tensor& v, const FlexOptions& o,
                      const Tensor& cot, const std::vector<Tensor>& extra = {}) {
  Tensor qd = q.to(dev, dt).detach().requires_grad_(), kd = k.to(dev, dt).detach().requires_grad_(),
         vd = v.to(dev, dt).detach().requires_grad_();
  const FlexOutput r = flex_attention(qd, kd, vd, o);
  std::vector<Tensor> wrt = {qd, kd, vd};
  for (const Tensor& e : extra) wrt.push_back(e);
  const std::vector<Tensor> g = autograd::grad({r.out}, wrt, {cot.to(dev, dt)});
  FlexRun res;
  res.out = r.out.to(kCPU, kFloat64);
  res.lse = r.lse.defined() ? r.lse.to(kCPU, kFloat64) : Tensor();
  for (const Tensor& x : g) res.grads.push_back(x.to(kCPU, kFloat64));
  return res;
}

// The tolerances against float64 of CUDA's output and gradients in dt.
inline double out_tolerance(DType dt) { return dt == kBFloat16 ? 2e-2 : 5e-3; }
inline double grad_tolerance(DType dt) { return dt == kBFloat16 ? 4e-2 : 1e-2; }

// Gradients of two runs (the GPU's against the float64 CPU kernels'), named dq, dk, dv, dextra..
inline void expect_grads_close(const FlexRun& gpu, const FlexRun& cpu, double tol) {
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  const char* names[] = {"dq", "dk", "dv", "dextra0", "dextra1"};
  for (size_t i = 0; i < gpu.grads.size(); ++i) {
    SCOPED_TRACE(names[std::min<size_t>(i, 4)]);
    EXPECT_CLOSE(gpu.grads[i], cpu.grads[i], tol);
  }
}

// CUDA against the float64 reference (out, lse) and the float64 CPU kernels (gradients).
inline void check_cuda(const GpuCase& c, DType dt, const MaskMod* mask, const MaskFn& mfn, const ScoreMod& smod,
                       const ScoreFn& sfn, const std::vector<Tensor>& extra = {}, bool device_mask = false) {
  const Tensor q = randn({c.B, c.Hq, c.L, c.E}, dt).to(kFloat64), k = randn({c.B, c.Hkv, c.S, c.E}, dt).to(kFloat64),
               v = randn({c.B, c.Hkv, c.S, c.E}, dt).to(kFloat64), cot = randn({c.B, c.Hq, c.L, c.E}, dt).to(kFloat64);
  FlexOptions o;
  o.score_mod = smod;
  o.enable_gqa = c.Hq != c.Hkv;
  o.return_lse = true;
  BlockMask bm, bm_dev;
  if (mask) {
    const int64_t mb = mask->expr.uses_b() ? c.B : 1, mh = mask->expr.uses_h() ? c.Hq : 1;
    bm = create_block_mask(*mask, mb, mh, c.L, c.S, c.bs);
    if (device_mask) {
      bm_dev = create_block_mask(*mask, mb, mh, c.L, c.S, c.bs, kGpu);
      ASSERT_TRUE(bm_dev.kv_indices.is_cuda());
    }
  }
  o.block_mask = mask ? (device_mask ? &bm_dev : &bm) : nullptr;
  const FlexRun gpu = run_on(kGpu, dt, q, k, v, o, cot, extra);
  const auto [ref_out, ref_lse] = reference(q, k, v, sfn, mfn);
  EXPECT_CLOSE(gpu.out, ref_out, out_tolerance(dt));
  EXPECT_CLOSE(gpu.lse, ref_lse, 1e-3);
  // Gradients against the CPU kernels in float64 (extra tensors' grads arrive on the CPU).
  o.block_mask = mask ? &bm : nullptr;
  expect_grads_close(gpu, run_on(kCPU, kFloat64, q, k, v, o, cot, extra), grad_tolerance(dt));
}

inline const MaskFn kCausal = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; };
// The reference of softcap(5.0).
inline const ScoreFn kSoftcap5 = [](double s, int64_t, int64_t, int64_t, int64_t) { return 5.0 * std::tanh(s / 5.0); };

// Two batches, GQA (4 q heads over 2 kv heads), L = 333 and the given S at E = 128: lengths that
// are not multiples of any tile.
inline GpuCase gqa_ragged_e128(int64_t S) {
  GpuCase c;
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.L = 333;
  c.S = S;
  c.E = 128;
  return c;
}

// A causal window of W with softcap(5.0) in bf16, against the reference.
inline void check_window_softcap(const GpuCase& c, int64_t W) {
  const MaskMod window = sliding_window_mask(W);
  const MaskFn f = [W](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < W; };
  check_cuda(c, kBFloat16, &window, f, softcap(5.0), kSoftcap5);
}

// Causal attention with relative_position_bias(bias, c.S) in bf16 against the reference read from
// bias's current values; `extra` = {bias} also checks its gradient.
inline void check_relative_bias(const GpuCase& c, const Tensor& bias, const std::vector<Tensor>& extra = {},
                                const ScoreMod* mod = nullptr) {
  const std::vector<double> bv = bias.to_vector();
  const int64_t off = c.S;
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, mod ? *mod : relative_position_bias(bias, off),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + bv[h * (c.L + c.S) + q - kv + off]; },
             extra);
}

// A causal document mask over c.S ids (a new document about every 97 positions) and its reference.
struct DocumentCase {
  std::vector<int64_t> ids;
  MaskMod mask;
  MaskFn fn;
};
inline DocumentCase causal_documents(int64_t S) {
  DocumentCase d;
  d.ids.resize(static_cast<size_t>(S));
  for (size_t i = 0, n = 0; i < d.ids.size(); ++i) d.ids[i] = static_cast<int64_t>(n += std::rand() % 97 == 0);
  d.mask = and_masks({document_mask(tensor(std::vector<double>(d.ids.begin(), d.ids.end()), kInt64)), causal_mask()});
  d.fn = [ids = d.ids](int64_t, int64_t, int64_t q, int64_t kv) { return ids[q] == ids[kv] && q >= kv; };
  return d;
}

inline bool same_bits(const Tensor& x, const Tensor& y) {
  const std::vector<double> u = x.to_vector(), w = y.to_vector();
  return u.size() == w.size() && std::memcmp(u.data(), w.data(), u.size() * sizeof(double)) == 0;
}

// Out, lse (where both have it) and every gradient bit for bit.
inline bool same_bits(const FlexRun& a, const FlexRun& b) {
  if (!same_bits(a.out, b.out) || a.grads.size() != b.grads.size()) return false;
  if (a.lse.defined() != b.lse.defined() || (a.lse.defined() && !same_bits(a.lse, b.lse))) return false;
  for (size_t i = 0; i < a.grads.size(); ++i)
    if (!same_bits(a.grads[i], b.grads[i])) return false;
  return true;
}

}  // namespace kiln::flex::testing
