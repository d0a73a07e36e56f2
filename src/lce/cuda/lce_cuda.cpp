// CUDA fused linear cross-entropy: the loop structure of the two strategies around cuda::gemm
// (cuBLASLt, cached plans) and the kernels of lce_kernels.cu, on the current stream of the input's
// device, as the call's lce::Plan lays them out. GEMM types: T in (bf16/fp16/fp32/fp64), fp32
// accumulation; logit tiles in T (16-bit T: half the bytes to write and read, twice the tokens per
// chunk; the one rounding torch's unfused linear makes). dz is written over its logit tile in place,
// in T, and the dx/dW GEMMs take it as their operand (TF32 for fp32 only when
// set_float32_matmul_precision("high")). Accumulators: dx_acc [N, H] fp32 (memory, 16-bit x only;
// fp32 x accumulates in dx itself), dW_t [Vc, H] fp32 per vocabulary tile when the tokens span
// several chunks (else the GEMM writes the dW slice in T); the speed strategy sums dW over token
// chunks in T itself.
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>

#include "core/cuda/check.h"
#include "core/cuda/side_stream.h"
#include "kiln/autograd.h"
#include "kiln/cuda.h"
#include "kiln/ops/linalg.h"
#include "lce/cuda/lce_kernels.h"
#include "lce/lce_internal.h"
#include "ops/cuda/gemm.h"

namespace kiln::cuda {
namespace {

struct Ctx {
  const lce::Problem& p;
  DType t, acc;
  bool low;  // 16-bit T
  int device;
  void* stream;
  bool tf32;
  explicit Ctx(const lce::Problem& pr)
      : p(pr),
        t(pr.x.dtype()),
        acc(pr.acc_dtype()),
        low(is_low_precision(pr.x.dtype())),
        device(pr.x.device().index),
        stream(current_raw_stream(pr.x.device().index)),
        tf32(get_float32_matmul_precision() == "high") {}
  size_t esize() const { return element_size(t); }
  size_t asize() const { return element_size(acc); }
  int64_t padded(int64_t cols) const { return lce::tile_stride(cols, t); }
  const char* xp(int64_t row) const { return static_cast<const char*>(p.x.data_ptr()) + row * p.k.h * esize(); }
  const char* wp(int64_t row) const { return static_cast<const char*>(p.w.data_ptr()) + row * p.k.h * esize(); }
  const void* bias() const { return p.bias.defined() ? p.bias.data_ptr() : nullptr; }
  const void* cw() const { return p.class_weight.defined() ? p.class_weight.data_ptr() : nullptr; }
  const int64_t* target() const { return p.target.data_ptr<int64_t>(); }
  Tensor buf(const Shape& s, DType d) const { return empty(s, TensorOptions().dtype(d).device(p.x.device())); }

  // C[m, n] (c_type, ldc) = op(A) op(B) + beta C, on `on` (default: the current stream).
  void mm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb,
          DType ab, void* c, int64_t ldc, DType ct, double beta, void* on = nullptr) const {
    GemmParams g;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.lda = lda;
    g.b = b;
    g.ldb = ldb;
    g.c = c;
    g.ldc = ldc;
    g.ab_type = ab;
    g.c_type = ct;
    g.beta = beta;
    g.allow_tf32 = tf32;
    g.device = device;
    g.stream = on ? on : stream;
    gemm(g);
  }
  void zero(const Tensor& z) const {
    if (z.numel() > 0) KILN_CUDA_CHECK(cudaMemsetAsync(z.data_ptr(), 0, z.nbytes(), static_cast<cudaStream_t>(stream)));
  }
};

Tensor make_totals(const Ctx& c) {
  Tensor tot = c.buf({4}, c.acc);
  lce_k::prepare(c.t, c.target(), c.cw(), c.p.k, tot.data_ptr(), c.stream);
  return tot;
}

// The per-token extras' buffers: predicted tokens [N] int64 and the row argmax state [Nc] (argmax),
// the token scaling factors [N] (token scaling).
Tensor alloc_extras(const Ctx& c, int64_t nc, lce::Forward& f) {
  if (c.p.k.token_scaling) f.tscale = c.buf({c.p.k.n}, c.acc);
  if (!c.p.k.argmax) return Tensor();
  f.predicted = c.buf({c.p.k.n}, kInt64);
  return c.buf({nc}, kInt64);
}

int64_t* ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<int64_t*>(t.data_ptr()) : nullptr; }
void* vptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

void outputs(const Ctx& c, const Tensor& terms, const Tensor& tot, lce::Forward& f) {
  const lce::Consts& k = c.p.k;
  const bool none = k.red == lce::Red::None;
  f.loss = none ? c.buf({k.n}, c.acc) : c.buf({}, c.acc);
  f.zterm = none ? c.buf({k.n}, c.acc) : c.buf({}, c.acc);
  lce_k::reduce(c.t, terms.data_ptr(), k.n, tot.data_ptr(), k, f.loss.data_ptr(), f.zterm.data_ptr(), c.stream);
}

}  // namespace

lce::Forward lce_forward_memory(const lce::Problem& p) {
  NoGradGuard ng;
  DeviceGuard dg(p.x.device().index);
  const Ctx c(p);
  const lce::Consts& k = p.k;
  const int64_t N = k.n, H = k.h, V = k.v, Nc = p.plan.chunk_n, Vc = p.plan.chunk_v;
  const int64_t ld = c.padded(Vc);
  const Tensor tot = make_totals(c);
  Tensor tile = c.buf({Nc, ld}, c.t), state = c.buf({4, Nc}, c.acc), terms = c.buf({2, N}, c.acc);
  lce::Forward f;
  f.lse = c.buf({N}, c.acc);
  const Tensor amax = alloc_extras(c, Nc, f);
  for (int64_t n0 = 0; n0 < N; n0 += Nc) {
    const int64_t rows = std::min(Nc, N - n0);
    for (int64_t v0 = 0; v0 < V; v0 += Vc) {
      const int64_t cols = std::min(Vc, V - v0);
      c.mm(false, true, rows, cols, H, c.xp(n0), H, c.wp(v0), H, c.t, tile.data_ptr(), ld, c.t, 0.0);
      lce_k::stats(c.t, tile.data_ptr(), rows, cols, ld, v0, c.bias(), c.cw(), c.target() + n0, k, v0 == 0,
                   state.data_ptr(), Nc, ptr_or_null(amax), c.stream);
    }
    lce_k::finalize(c.t, rows, n0, state.data_ptr(), Nc, c.target(), c.cw(), tot.data_ptr(), k, f.lse.data_ptr(),
                    terms.data_ptr(), N, ptr_or_null(amax), ptr_or_null(f.predicted), vptr_or_null(f.tscale), c.stream);
  }
  outputs(c, terms, tot, f);
  return f;
}

lce::Grads lce_backward_memory(const lce::Problem& p, const Tensor& lse, const Tensor& tscale, const Tensor& grad,
                               const lce::Needs& nd) {
  NoGradGuard ng;
  DeviceGuard dg(p.x.device().index);
  const Ctx c(p);
  const lce::Consts& k = p.k;
  const int64_t N = k.n, H = k.h, V = k.v, Nc = p.plan.chunk_n, Vc = p.plan.chunk_v;
  lce::Grads out;
  Tensor dx_acc;
  if (nd.dx) {
    out.dx = c.buf({N, H}, c.t);
    dx_acc = c.low ? c.buf({N, H}, c.acc) : out.dx;  // the one N x H fp32 buffer (16-bit x only)
    c.zero(dx_acc);
  }
  if (nd.dw) out.dw = c.buf({V, H}, c.t);
  if (nd.db) out.db = c.buf({V}, c.t);
  if (N == 0) {
    if (nd.dw) c.zero(out.dw);
    if (nd.db) c.zero(out.db);
    if (nd.dx) c.zero(out.dx);
    return out;
  }
  const int64_t ld = c.padded(Vc);
  const Tensor tot = make_totals(c);
  Tensor tile = c.buf({Nc, ld}, c.t);
  void* dz = tile.data_ptr();      // dz overwrites the tile in place
  const bool one_chunk = Nc >= N;  // dW slices written in T directly, no fp32 tile
  const bool dw_acc = c.low && !one_chunk;
  Tensor dwt = nd.dw && dw_acc ? c.buf({Vc, H}, c.acc) : Tensor();
  Tensor dbt = nd.db ? c.buf({Vc}, c.acc) : Tensor();
  const bool per_token = k.red == lce::Red::None;
  // One stream: the dW GEMMs on a side stream measured slower here (H200, 8192 x 4096 x 128256 bf16:
  // 48.9-52.0 ms against 47.5-48.1).
  for (int64_t v0 = 0; v0 < V; v0 += Vc) {
    const int64_t cols = std::min(Vc, V - v0);
    void* dws = !nd.dw ? nullptr
                : dw_acc ? dwt.data_ptr()
                         : static_cast<char*>(out.dw.data_ptr()) + v0 * H * c.esize();
    for (int64_t n0 = 0; n0 < N; n0 += Nc) {
      const int64_t rows = std::min(Nc, N - n0);
      c.mm(false, true, rows, cols, H, c.xp(n0), H, c.wp(v0), H, c.t, tile.data_ptr(), ld, c.t, 0.0);
      lce_k::grad(c.t, tile.data_ptr(), rows, cols, ld, v0, n0, c.bias(), c.cw(), c.target(), lse.data_ptr(),
                  grad.data_ptr(), per_token, vptr_or_null(tscale), tot.data_ptr(), k, dz, ld, c.stream);
      if (nd.dx)
        c.mm(false, false, rows, H, cols, dz, ld, c.wp(v0), H, c.t,
             static_cast<char*>(dx_acc.data_ptr()) + n0 * H * c.asize(), H, c.acc, 1.0);
      if (nd.dw)
        c.mm(true, false, cols, H, rows, dz, ld, c.xp(n0), H, c.t, dws, H, dw_acc || !c.low ? c.acc : c.t,
             n0 == 0 ? 0.0 : 1.0);
      if (nd.db) lce_k::colsum(c.t, dz, rows, cols, ld, n0 == 0, dbt.data_ptr(), c.stream);
    }
    if (nd.dw && dw_acc)
      lce_k::store(c.t, dwt.data_ptr(), static_cast<char*>(out.dw.data_ptr()) + v0 * H * c.esize(), cols * H,
                   c.stream);
    if (nd.db)
      lce_k::store(c.t, dbt.data_ptr(), static_cast<char*>(out.db.data_ptr()) + v0 * c.esize(), cols, c.stream);
  }
  if (nd.dx && c.low) lce_k::store(c.t, dx_acc.data_ptr(), out.dx.data_ptr(), N * H, c.stream);
  return out;
}

lce::Forward lce_forward_speed(const lce::Problem& p, const lce::Needs& nd) {
  NoGradGuard ng;
  DeviceGuard dg(p.x.device().index);
  const Ctx c(p);
  const lce::Consts& k = p.k;
  const int64_t N = k.n, H = k.h, V = k.v, Nc = p.plan.chunk_n;
  const Tensor tot = make_totals(c);
  const int64_t ld = c.padded(V);
  // One logits buffer: two half-budget buffers, a chunk's row passes beside the previous chunk's
  // GEMMs, measured slower (H200, 8192 x 4096 x 128256: 41.62 ms against 36.31).
  Tensor logits = c.buf({Nc, ld}, c.t), state = c.buf({4, Nc}, c.acc), terms = c.buf({2, N}, c.acc);
  void* dz = logits.data_ptr();  // dz overwrites the logits in place
  lce::Forward f;
  f.lse = c.buf({N}, c.acc);
  const Tensor amax = alloc_extras(c, Nc, f);
  if (nd.dx) f.dx = c.buf({N, H}, c.t);
  if (nd.dw) f.dw = c.buf({V, H}, c.t);
  if (nd.db) f.db = c.buf({V}, c.t);
  // dW accumulates over token chunks in the GEMM's output, in T: for 16-bit weights one rounding
  // per chunk (the memory strategy rounds once); a [V, H] fp32 accumulator would cost more
  // memory than the logits chunk and a slower GEMM epilogue.
  Tensor db_acc = nd.db ? c.buf({V}, c.acc) : Tensor();
  std::optional<SideStream> side;
  if (p.plan.side_stream) side.emplace(c.device, c.stream);
  if (nd.db && N == 0) c.zero(db_acc);
  if (nd.dw && N == 0) c.zero(f.dw);
  if (nd.dx && N == 0) c.zero(f.dx);
  for (int64_t n0 = 0; n0 < N; n0 += Nc) {
    const int64_t rows = std::min(Nc, N - n0);
    if (side) side->join();  // the chunk's logits overwrite the dz the last dW GEMM read
    c.mm(false, true, rows, V, H, c.xp(n0), H, c.wp(0), H, c.t, logits.data_ptr(), ld, c.t, 0.0);
    lce_k::stats(c.t, logits.data_ptr(), rows, V, ld, 0, c.bias(), c.cw(), c.target() + n0, k, true,
                 state.data_ptr(), Nc, ptr_or_null(amax), c.stream);
    lce_k::finalize(c.t, rows, n0, state.data_ptr(), Nc, c.target(), c.cw(), tot.data_ptr(), k, f.lse.data_ptr(),
                    terms.data_ptr(), N, ptr_or_null(amax), ptr_or_null(f.predicted), vptr_or_null(f.tscale), c.stream);
    if (!nd.any()) continue;
    lce_k::grad(c.t, logits.data_ptr(), rows, V, ld, 0, n0, c.bias(), c.cw(), c.target(), f.lse.data_ptr(), nullptr,
                false, vptr_or_null(f.tscale), tot.data_ptr(), k, dz, ld, c.stream);
    if (nd.dw) {  // on the side stream when there is one: its tiles fill the dx GEMM's last wave
      if (side) side->follow();
      c.mm(true, false, V, H, rows, dz, ld, c.xp(n0), H, c.t, f.dw.data_ptr(), H, c.t, n0 == 0 ? 0.0 : 1.0,
           side ? side->stream() : nullptr);
    }
    if (nd.dx)  // each dx row block is produced once: written in T directly
      c.mm(false, false, rows, H, V, dz, ld, c.wp(0), H, c.t, static_cast<char*>(f.dx.data_ptr()) + n0 * H * c.esize(),
           H, c.t, 0.0);
    if (nd.db) lce_k::colsum(c.t, dz, rows, V, ld, n0 == 0, db_acc.data_ptr(), c.stream);
  }
  if (side) side->join();  // dW complete before anyone reads it or frees a buffer
  if (nd.db) lce_k::store(c.t, db_acc.data_ptr(), f.db.data_ptr(), V, c.stream);
  outputs(c, terms, tot, f);
  return f;
}

Tensor lce_scale(const Tensor& src, const Tensor& g, bool in_place) {
  NoGradGuard ng;
  DeviceGuard dg(src.device().index);
  Tensor out = in_place ? src : empty(src.sizes(), src.options());
  lce_k::scale(src.dtype(), src.data_ptr(), g.data_ptr(), out.data_ptr(), src.numel(),
               current_raw_stream(src.device().index));
  return out;
}

}  // namespace kiln::cuda
