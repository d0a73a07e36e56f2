// CUDA gathers (index_select, gather, embedding forward), index validation and the
// deterministic scatter_add.
// - find_bad_index: one grid-stride pass; a bad position is atomicMin'ed into a device word
//   (integer atomics: the smallest bad position wins whatever the schedule), which the host
//   reads back. Kernels never trap: a trap would poison the CUDA context of a whole trainer.
// - index_select_rows: rows of `inner` elements moved as the widest unit (16/8/4/2/1 bytes)
//   that divides the row and both base addresses, so contiguous bf16/f32 rows of 768 move with
//   16-byte loads and stores. Reads x, index; writes every element of out once.
// - index_gather: strided fallback, one thread per output element through OffsetCalc<3>.
// - scatter_add_lines: one thread per line (all coordinates but dim fixed) adds its sources in
//   increasing order; lines never share a destination, so no float atomics and the result is
//   bitwise identical run to run. 16-bit inputs accumulate in an fp32 staging buffer.
#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/cuda/offset_calc.cuh"
#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/tensor_impl.h"
#include "ops/cuda/indexing.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

cudaStream_t stream_of(const Tensor& t) { return current_raw_stream(t.device().index); }

template <typename F>
void dispatch_width(size_t width, const char* op, F&& f) {
  switch (width) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    case 8: return f(TypeTag<uint64_t>{});
    case 16: return f(TypeTag<uint4>{});
    default: KILN_FAIL(op, "unsupported element size ", width);
  }
}

template <typename I>
__global__ void find_bad_kernel(const I* idx, int64_t k, int64_t bound, unsigned long long* flag) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < k;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = static_cast<int64_t>(idx[i]);
    if (t < 0 || t >= bound) atomicMin(flag, static_cast<unsigned long long>(i));
  }
}

// U: the moved unit; upr: units per row.
template <typename U, typename I>
__global__ void select_rows_kernel(U* out, const U* x, const I* idx, int64_t k, int64_t n, int64_t upr,
                                   int64_t total) {
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = u / upr, c = u - row * upr;
    const int64_t o = row / k, i = row - o * k;
    const int64_t t = static_cast<int64_t>(idx[i]);
    if (t < 0 || t >= n) continue;
    out[u] = x[(o * n + t) * upr + c];
  }
}

template <typename E, typename I>
__global__ void gather_kernel(E* out, const E* x, const I* idx, int64_t total, OffsetCalc<3> calc, int64_t xs,
                              int64_t bound) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    calc.get(p, off);
    const int64_t t = static_cast<int64_t>(idx[off[2]]);
    if (t < 0 || t >= bound) continue;
    out[off[0]] = x[off[1] + t * xs];
  }
}

template <typename A, typename S, typename I>
__global__ void scatter_add_lines_kernel(A* out, const I* idx, const S* src, int64_t lines, OffsetCalc<3> calc,
                                         int64_t m, int64_t out_sd, int64_t index_sd, int64_t src_sd,
                                         int64_t bound) {
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    calc.get(l, off);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = static_cast<int64_t>(idx[off[1] + i * index_sd]);
      if (t < 0 || t >= bound) continue;
      A* dst = out + off[0] + t * out_sd;
      *dst = convert<A>(*dst + convert<A>(src[off[2] + i * src_sd]));
    }
  }
}

size_t widest_unit(size_t row_bytes, const void* a, const void* b) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  for (size_t w = 16; w > 1; w /= 2)
    if (row_bytes % w == 0 && pa % w == 0 && pb % w == 0) return w;
  return 1;
}

}  // namespace

int64_t find_bad_index(const Tensor& index, int64_t bound) {
  const int64_t k = index.numel();
  if (k == 0) return -1;
  DeviceGuard guard(index.device().index);
  // The flag lives in a kiln tensor so it is counted in the memory stats; all-ones = no bad index.
  Tensor flag = make_tensor({1}, kInt64, index.device());
  KILN_CUDA_CHECK(cudaMemsetAsync(flag.data_ptr(), 0xff, sizeof(unsigned long long), stream_of(index)));
  dispatch_index(index.dtype(), "index", [&](auto tag) {
    using I = typename decltype(tag)::type;
    find_bad_kernel<I><<<blocks_for(k, kThreads, 4096), kThreads, 0, stream_of(index)>>>(
        index.data_ptr<I>(), k, bound, static_cast<unsigned long long*>(flag.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH("index validation");
  });
  unsigned long long pos = 0;
  memcpy_device_to_host(&pos, flag.data_ptr(), sizeof(pos), index.device().index);
  return pos == ~0ull ? -1 : static_cast<int64_t>(pos);
}

void index_select_rows(const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer, int64_t n,
                       int64_t inner) {
  const int64_t k = index.numel();
  if (outer * k * inner == 0) return;
  DeviceGuard guard(out.device().index);
  const size_t row_bytes = static_cast<size_t>(inner) * x.element_size();
  const size_t w = widest_unit(row_bytes, out.data_ptr(), x.data_ptr());
  const int64_t upr = static_cast<int64_t>(row_bytes / w), total = outer * k * upr;
  dispatch_width(w, "index_select", [&](auto wtag) {
    using U = typename decltype(wtag)::type;
    dispatch_index(index.dtype(), "index_select", [&](auto itag) {
      using I = typename decltype(itag)::type;
      select_rows_kernel<U, I><<<blocks_for(total, kThreads), kThreads, 0, stream_of(out)>>>(
          static_cast<U*>(out.data_ptr()), static_cast<const U*>(x.data_ptr()), index.data_ptr<I>(), k, n, upr,
          total);
      KILN_CUDA_CHECK_LAUNCH("index_select");
    });
  });
}

void index_gather(const Tensor& out, const Tensor& x_r, const Tensor& index_r, int64_t x_dim_stride, int64_t bound) {
  const int64_t total = out.numel();
  if (total == 0) return;
  DeviceGuard guard(out.device().index);
  const auto calc = make_offset_calc(make_geometry<3>({&out, &x_r, &index_r}), "gather");
  dispatch_width(out.element_size(), "gather", [&](auto wtag) {
    using E = typename decltype(wtag)::type;
    dispatch_index(index_r.dtype(), "gather", [&](auto itag) {
      using I = typename decltype(itag)::type;
      gather_kernel<E, I><<<blocks_for(total, kThreads), kThreads, 0, stream_of(out)>>>(
          static_cast<E*>(out.data_ptr()), static_cast<const E*>(x_r.data_ptr()), index_r.data_ptr<I>(), total,
          calc, x_dim_stride, bound);
      KILN_CUDA_CHECK_LAUNCH("gather");
    });
  });
}

void scatter_add_lines(const Tensor& out_l, const Tensor& index_l, const Tensor& src_l, int64_t m, int64_t out_sd,
                       int64_t index_sd, int64_t src_sd, int64_t bound) {
  const int64_t lines = index_l.numel();
  if (lines == 0 || m == 0) return;
  DeviceGuard guard(out_l.device().index);
  const auto calc = make_offset_calc(make_geometry<3>({&out_l, &index_l, &src_l}), "scatter_add");
  dispatch_all(src_l.dtype(), "scatter_add", [&](auto stag) {
    using S = device_t<typename decltype(stag)::type>;
    using A = dacc_t<S>;
    dispatch_index(index_l.dtype(), "scatter_add", [&](auto itag) {
      using I = typename decltype(itag)::type;
      // Fewer threads per block: each thread runs a serial loop of m steps, and small line
      // counts still spread over several SMs.
      constexpr int kLineThreads = 128;
      scatter_add_lines_kernel<A, S, I><<<blocks_for(lines, kLineThreads), kLineThreads, 0, stream_of(out_l)>>>(
          static_cast<A*>(out_l.data_ptr()), index_l.data_ptr<I>(), static_cast<const S*>(src_l.data_ptr()), lines,
          calc, m, out_sd, index_sd, src_sd, bound);
      KILN_CUDA_CHECK_LAUNCH("scatter_add");
    });
  });
}

}  // namespace kiln::cuda
