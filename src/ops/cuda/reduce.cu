// CUDA reductions over [outer, r, inner] (see ops/reduce_geom.h), plus the backward helpers.
//
// Row kernel (inner == 1, unit-stride r: the contiguous last-dim case and full reductions):
// one 512-thread block per (row, chunk) work item (one warp per row for rows of <= 8192
// elements), 16-byte vector loads, four in flight per thread, then a warp-shuffle (and
// shared-memory) tree. Column kernel (everything else): one thread
// per (output, chunk), walking r sequentially; adjacent threads own adjacent inner outputs, so
// unit-stride inner dims are read coalesced.
// When there are too few outputs to fill the GPU, r is split into chunks whose length depends
// only on the shape; chunk partials go to a scratch buffer and a second kernel (one warp per
// output) combines them. No atomics anywhere: every result has a fixed summation tree, so runs
// are bitwise reproducible.
#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/cuda/offset_calc.cuh"
#include "core/dispatch.h"
#include "ops/cuda/reduce.h"
#include "ops/cuda/reduce_common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kRowThreads = 512;
constexpr int kThreads = 256;
constexpr int64_t kRowItems = 2048;         // row work items wanted: ~15 blocks per SM on an H200
constexpr int64_t kColThreadsWanted = 1 << 18;  // column work threads wanted (~2K per SM)
constexpr int64_t kChunkAlign = 4096;       // row chunk lengths are multiples: keeps 16-byte alignment
constexpr int64_t kMinColChunk = 64;
constexpr int64_t kWarpRowMax = 8192;      // rows up to this length get a warp (many rows in flight per SM), longer ones a block
constexpr unsigned kMaxBlocks = 65535u * 16u;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// kWarp: one warp per work item (rows of 32..8192 elements), else the whole block.
template <typename T, typename A, typename Op, typename W, int VEC, bool kWarp>
__global__ void __launch_bounds__(kRowThreads)
    row_kernel(const T* __restrict__ x, ReduceGeom g, int64_t len_chunk, int64_t nchunks,
               typename Op::Acc* __restrict__ partial, W w) {
  using Acc = typename Op::Acc;
  const int64_t items = g.outer * nchunks;
  const int64_t nt = kWarp ? 32 : blockDim.x;
  const int tid = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t per_block = kWarp ? (blockDim.x >> 5) : 1;
  const int64_t first = blockIdx.x * per_block + (kWarp ? (threadIdx.x >> 5) : 0);
  for (int64_t item = first; item < items; item += gridDim.x * per_block) {
    const int64_t o = item / nchunks, c = item % nchunks;
    const int64_t r0 = c * len_chunk, len = min(len_chunk, g.r - r0);
    const T* p = x + o * g.so + r0;
    Acc a = Op::init();
    int64_t done = 0;
    if constexpr (VEC > 1) {
      using P = Pack<T, VEC>;
      const P* pv = reinterpret_cast<const P*>(p);
      const int64_t nvec = len / VEC;
      int64_t v = tid;
      for (; v + 3 * nt < nvec; v += 4 * nt) {
        P q[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) q[u] = pv[v + u * nt];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int e = 0; e < VEC; ++e) Op::add(a, convert<A>(q[u].v[e]), r0 + (v + u * nt) * VEC + e);
      }
      for (; v < nvec; v += nt) {
        const P q = pv[v];
#pragma unroll
        for (int e = 0; e < VEC; ++e) Op::add(a, convert<A>(q.v[e]), r0 + v * VEC + e);
      }
      done = nvec * VEC;
    }
    for (int64_t j = done + tid; j < len; j += nt) Op::add(a, convert<A>(p[j]), r0 + j);
    if constexpr (kWarp) {
      a = warp_reduce<Op>(a);
    } else {
      a = block_reduce<Op>(a);
    }
    if (tid == 0) {
      if (nchunks == 1) {
        w(o * g.oo, a);
      } else {
        partial[item] = a;
      }
    }
  }
}

template <typename T, typename A, typename Op, typename W>
__global__ void __launch_bounds__(kThreads)
    col_kernel(const T* __restrict__ x, ReduceGeom g, int64_t len_chunk, int64_t nchunks,
               typename Op::Acc* __restrict__ partial, W w) {
  using Acc = typename Op::Acc;
  const int64_t items = g.outer * g.inner * nchunks;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = item % g.inner, t = item / g.inner, o = t % g.outer, c = t / g.outer;
    const int64_t r0 = c * len_chunk, r1 = min(g.r, r0 + len_chunk);
    const T* p = x + o * g.so + i * g.si + r0 * g.sr;
    Acc a = Op::init();
#pragma unroll 4
    for (int64_t r = r0; r < r1; ++r, p += g.sr) Op::add(a, convert<A>(*p), r);
    const int64_t q = o * g.inner + i;
    if (nchunks == 1) {
      w(o * g.oo + i * g.oi, a);
    } else {
      partial[q * nchunks + c] = a;
    }
  }
}

// Column kernel for 16-bit types with unit-stride inner dims: each thread owns two adjacent
// columns and reads them as one 4-byte word, so a warp moves 128 B per step instead of 64 B
// (the scalar kernel reached 78% of copy bandwidth on bf16 [n, 4096] dim-0 sums on the H200).
template <typename T, typename A, typename Op, typename W>
__global__ void __launch_bounds__(kThreads)
    col_pair_kernel(const T* __restrict__ x, ReduceGeom g, int64_t len_chunk, int64_t nchunks,
                    typename Op::Acc* __restrict__ partial, W w) {
  using Acc = typename Op::Acc;
  using P = Pack<T, 2>;
  const int64_t pairs = g.inner / 2;
  const int64_t items = g.outer * pairs * nchunks;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = (item % pairs) * 2, t = item / pairs, o = t % g.outer, c = t / g.outer;
    const int64_t r0 = c * len_chunk, r1 = min(g.r, r0 + len_chunk);
    const T* p = x + o * g.so + i + r0 * g.sr;
    Acc a0 = Op::init(), a1 = Op::init();
#pragma unroll 4
    for (int64_t r = r0; r < r1; ++r, p += g.sr) {
      const P v = *reinterpret_cast<const P*>(p);
      Op::add(a0, convert<A>(v.v[0]), r);
      Op::add(a1, convert<A>(v.v[1]), r);
    }
    const int64_t q = o * g.inner + i;
    if (nchunks == 1) {
      w(o * g.oo + i * g.oi, a0);
      w(o * g.oo + (i + 1) * g.oi, a1);
    } else {
      partial[q * nchunks + c] = a0;
      partial[(q + 1) * nchunks + c] = a1;
    }
  }
}

// One warp per output: lanes stride over the chunk partials, then a warp tree.
template <typename Op, typename W>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const typename Op::Acc* __restrict__ partial, ReduceGeom g, int64_t nchunks, W w) {
  using Acc = typename Op::Acc;
  const int lane = threadIdx.x & 31;
  const int64_t outputs = g.outer * g.inner;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t q = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; q < outputs; q += warps) {
    Acc a = Op::init();
    for (int64_t c = lane; c < nchunks; c += 32) a = Op::merge(a, partial[q * nchunks + c]);
    a = warp_reduce<Op>(a);
    if (lane == 0) w((q / g.inner) * g.oo + (q % g.inner) * g.oi, a);
  }
}

// ---- output writers ----
template <typename O, typename A>
struct SumWriter {
  O* y;
  A scale;
  bool mean;
  __device__ void operator()(int64_t off, A a) const { y[off] = convert<O>(mean ? a * scale : a); }
};
template <typename T, typename A>
struct ValueWriter {
  T* y;
  __device__ void operator()(int64_t off, A a) const { y[off] = convert<T>(a); }
};
template <typename T, typename A>
struct ArgWriter {
  T* y;  // may be null (argmax)
  int64_t* idx;
  __device__ void operator()(int64_t off, ArgAcc<A> a) const {
    idx[off] = a.i;
    if (y) y[off] = convert<T>(a.v);
  }
};
template <typename T, typename A>
struct LseWriter {
  T* y;
  __device__ void operator()(int64_t off, LseAcc<A> a) const { y[off] = convert<T>(LseOp<A>::result(a)); }
};

template <typename T, typename A, typename Op, typename W>
void launch(const Tensor& xt, const ReduceGeom& g, W w, const char* op) {
  using Acc = typename Op::Acc;
  cudaStream_t stream = current_raw_stream(xt.device().index);
  const T* x = static_cast<const T*>(xt.data_ptr());
  const int64_t outputs = g.outer * g.inner;
  // Rows shorter than a warp go to the column kernel (a thread per row) instead.
  const bool row = g.inner == 1 && g.sr == 1 && (g.r >= 32 || outputs < kRowItems);
  int64_t len_chunk, nchunks;
  if (row) {
    const int64_t want = std::max<int64_t>(1, kRowItems / g.outer);
    len_chunk = ceil_div(ceil_div(g.r, want), kChunkAlign) * kChunkAlign;
  } else {
    const int64_t want = std::max<int64_t>(1, kColThreadsWanted / outputs);
    len_chunk = std::max(kMinColChunk, ceil_div(g.r, want));
  }
  nchunks = ceil_div(g.r, len_chunk);
  Tensor scratch;
  Acc* partial = nullptr;
  if (nchunks > 1) {
    scratch = empty({outputs * nchunks * static_cast<int64_t>(sizeof(Acc))}, TensorOptions(kUInt8).device(xt.device()));
    partial = static_cast<Acc*>(scratch.data_ptr());
  }
  if (row) {
    constexpr int kVec = 16 / sizeof(T);
    const bool warp = g.r <= kWarpRowMax;  // then nchunks == 1: len_chunk >= kChunkAlign
    const int64_t per_block = warp ? kRowThreads / 32 : 1;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(g.outer * nchunks, per_block), kMaxBlocks));
    const bool aligned = kVec > 1 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                         (g.outer == 1 || (g.so * static_cast<int64_t>(sizeof(T))) % 16 == 0);
    if constexpr (kVec > 1) {
      if (aligned && warp) {
        row_kernel<T, A, Op, W, kVec, true><<<blocks, kRowThreads, 0, stream>>>(x, g, len_chunk, nchunks, partial, w);
      } else if (aligned) {
        row_kernel<T, A, Op, W, kVec, false><<<blocks, kRowThreads, 0, stream>>>(x, g, len_chunk, nchunks, partial, w);
      }
    }
    if (!aligned && warp) {
      row_kernel<T, A, Op, W, 1, true><<<blocks, kRowThreads, 0, stream>>>(x, g, len_chunk, nchunks, partial, w);
    } else if (!aligned) {
      row_kernel<T, A, Op, W, 1, false><<<blocks, kRowThreads, 0, stream>>>(x, g, len_chunk, nchunks, partial, w);
    }
  } else if (sizeof(T) == 2 && g.si == 1 && g.inner % 2 == 0 && g.so % 2 == 0 && g.sr % 2 == 0 &&
             reinterpret_cast<uintptr_t>(x) % 4 == 0) {
    col_pair_kernel<T, A, Op, W><<<blocks_for(outputs / 2 * nchunks, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        x, g, len_chunk, nchunks, partial, w);
  } else {
    col_kernel<T, A, Op, W><<<blocks_for(outputs * nchunks, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        x, g, len_chunk, nchunks, partial, w);
  }
  KILN_CUDA_CHECK_LAUNCH(op);
  if (nchunks > 1) {
    combine_kernel<Op, W><<<blocks_for(outputs * 32, kThreads, kMaxBlocks), kThreads, 0, stream>>>(partial, g, nchunks, w);
    KILN_CUDA_CHECK_LAUNCH(op);
  }
}

template <int N, typename F>
__global__ void map_kernel(int64_t n, OffsetCalc<N> calc, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[N];
    calc.get(i, off);
    f(off);
  }
}

template <int N, typename F>
void launch_map(const std::array<const Tensor*, N>& ts, F f, const char* op) {
  const int64_t n = ts[0]->numel();
  if (n == 0) return;
  DeviceGuard guard(ts[0]->device().index);
  const auto calc = make_offset_calc(make_geometry<N>(ts), op);
  map_kernel<N, F><<<blocks_for(n, kThreads), kThreads, 0, current_raw_stream(ts[0]->device().index)>>>(n, calc, f);
  KILN_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
struct ScaleF {
  T* dst;
  const T* src;
  dacc_t<T> scale;
  __device__ void operator()(const int64_t (&off)[2]) const {
    dst[off[0]] = convert<T>(convert<dacc_t<T>>(src[off[1]]) * scale);
  }
};
template <typename T>
struct TiesMaskF {
  dacc_t<T>* mask;
  const T* x;
  const T* y;
  __device__ void operator()(const int64_t (&off)[3]) const {
    const dacc_t<T> a = convert<dacc_t<T>>(x[off[1]]), b = convert<dacc_t<T>>(y[off[2]]);
    mask[off[0]] = (a == b || (isnan(a) && isnan(b))) ? 1 : 0;
  }
};
template <typename T>
struct TiesGradF {
  T* dst;
  const dacc_t<T>* mask;
  const T* g;
  const dacc_t<T>* cnt;
  __device__ void operator()(const int64_t (&off)[4]) const {
    using A = dacc_t<T>;
    dst[off[0]] = convert<T>(mask[off[1]] != A(0) ? convert<A>(g[off[2]]) / cnt[off[3]] : A(0));
  }
};
template <typename T>
struct ArgGradF {
  T* dst;
  const int64_t* idx;
  const int64_t* iota;
  const T* g;
  __device__ void operator()(const int64_t (&off)[4]) const {
    dst[off[0]] = idx[off[1]] == iota[off[2]] ? g[off[3]] : convert<T>(0.0f);
  }
};
template <typename T>
struct LseGradF {
  T* dst;
  const T* x;
  const dacc_t<T>* y;
  const T* g;
  __device__ void operator()(const int64_t (&off)[4]) const {
    using A = dacc_t<T>;
    dst[off[0]] = convert<T>(convert<A>(g[off[3]]) * d_exp(convert<A>(x[off[1]]) - y[off[2]]));
  }
};

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void reduce(ReduceKind kind, const Tensor& x, const ReduceGeom& g, const Tensor& out, const Tensor& indices) {
  DeviceGuard guard(x.device().index);
  dispatch_all(x.dtype(), "reduce", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    using A = dacc_t<T>;
    constexpr bool kFloat = std::is_floating_point_v<A>;
    switch (kind) {
      case ReduceKind::Sum:
      case ReduceKind::Mean: {
        using SA = std::conditional_t<kFloat, A, int64_t>;
        using O = std::conditional_t<kFloat, T, int64_t>;
        const SumWriter<O, SA> w{ptr<O>(out), SA(1) / static_cast<SA>(g.r), kind == ReduceKind::Mean};
        launch<T, SA, SumOp<SA>>(x, g, w, "sum");
        return;
      }
      case ReduceKind::Max:
        launch<T, A, ExtremeOp<A, true>>(x, g, ValueWriter<T, A>{ptr<T>(out)}, "amax");
        return;
      case ReduceKind::Min:
        launch<T, A, ExtremeOp<A, false>>(x, g, ValueWriter<T, A>{ptr<T>(out)}, "amin");
        return;
      case ReduceKind::ArgMax: {
        const ArgWriter<T, A> w{out.defined() ? ptr<T>(out) : nullptr, ptr<int64_t>(indices)};
        launch<T, A, ArgMaxOp<A>>(x, g, w, "argmax");
        return;
      }
      case ReduceKind::ArgMin: {
        const ArgWriter<T, A> w{out.defined() ? ptr<T>(out) : nullptr, ptr<int64_t>(indices)};
        launch<T, A, ArgMaxOp<A, false>>(x, g, w, "argmin");
        return;
      }
      case ReduceKind::LogSumExp:
        if constexpr (kFloat) launch<T, A, LseOp<A>>(x, g, LseWriter<A, A>{ptr<A>(out)}, "logsumexp");
        return;
    }
  });
}

void scale_broadcast(const Tensor& dst, const Tensor& src, double scale) {
  dispatch_floating(dst.dtype(), "mean", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    launch_map<2>({&dst, &src}, ScaleF<T>{ptr<T>(dst), ptr<const T>(src), static_cast<dacc_t<T>>(scale)}, "mean");
  });
}

void ties_mask(const Tensor& mask, const Tensor& x, const Tensor& y) {
  dispatch_floating(x.dtype(), "amax", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    launch_map<3>({&mask, &x, &y}, TiesMaskF<T>{ptr<dacc_t<T>>(mask), ptr<const T>(x), ptr<const T>(y)}, "amax");
  });
}

void ties_grad(const Tensor& dst, const Tensor& mask, const Tensor& g, const Tensor& cnt) {
  dispatch_floating(dst.dtype(), "amax", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    launch_map<4>({&dst, &mask, &g, &cnt},
                  TiesGradF<T>{ptr<T>(dst), ptr<const dacc_t<T>>(mask), ptr<const T>(g), ptr<const dacc_t<T>>(cnt)},
                  "amax");
  });
}

void argmax_grad(const Tensor& dst, const Tensor& idx, const Tensor& iota, const Tensor& g) {
  dispatch_floating(dst.dtype(), "max", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    launch_map<4>({&dst, &idx, &iota, &g},
                  ArgGradF<T>{ptr<T>(dst), ptr<const int64_t>(idx), ptr<const int64_t>(iota), ptr<const T>(g)}, "max");
  });
}

void lse_grad(const Tensor& dst, const Tensor& x, const Tensor& y, const Tensor& g) {
  dispatch_floating(dst.dtype(), "logsumexp", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    launch_map<4>({&dst, &x, &y, &g}, LseGradF<T>{ptr<T>(dst), ptr<const T>(x), ptr<const dacc_t<T>>(y), ptr<const T>(g)},
                  "logsumexp");
  });
}

}  // namespace kiln::cuda
