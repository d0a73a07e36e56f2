// CPU FlexAttention benchmark: f32 1x4x4096x64 with a causal sliding window of 256, block-sparse
// (flex) against the same kernels visiting every block with the mask evaluated everywhere (dense),
// forward and forward+backward; then BlockMask creation for the same mask and for 1M tokens.
// Prints one JSON object per line:
//   {"variant": "flex" | "dense", "fwd_ms": ..., "fwd_bwd_ms": ..., "peak_extra_bytes": ...}
//   {"variant": "block_mask", "create_ms": ..., "sparsity": (percent of blocks skipped, as
//    BlockMask::sparsity()), "bytes": ..., "seq": ...}
// Usage: bench_flex [B H S D W]   (defaults 1 4 4096 64 256)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;
using namespace kiln::flex;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename Fn>
double median_ms(Fn&& fn, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_ms();
    fn();
    t.push_back(now_ms() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Every block listed as partial: the kernels visit all of S and apply the mask everywhere.
BlockMask dense_mask(const MaskMod& m, int64_t L, int64_t S) {
  const int64_t nQ = (L + 127) / 128, nKV = (S + 127) / 128;
  Tensor num = full({1, 1, nQ}, static_cast<double>(nKV), kInt32);
  Tensor idx = empty({1, 1, nQ, nKV}, kInt32);
  for (int64_t i = 0; i < nQ; ++i)
    for (int64_t j = 0; j < nKV; ++j) idx.data_ptr<int32_t>()[i * nKV + j] = static_cast<int32_t>(j);
  return BlockMask::from_kv_blocks(num, idx, Tensor(), Tensor(), L, S, 128, m);
}

void run(const char* variant, const Tensor& q, const Tensor& k, const Tensor& v, const BlockMask& bm, int reps) {
  FlexOptions o;
  o.block_mask = &bm;
  const Tensor g = randn(q.sizes());
  flex_attention(q, k, v, o);  // warm up
  const int64_t base = memory_allocated(kCPU);
  reset_peak_memory_stats(kCPU);
  const double fwd = median_ms([&] {
    NoGradGuard ng;
    flex_attention(q, k, v, o);
  }, reps);
  const double fwd_bwd = median_ms([&] {
    Tensor out = flex_attention(q, k, v, o);
    autograd::grad({out}, {q, k, v}, {g});
  }, reps);
  const int64_t peak = max_memory_allocated(kCPU) - base;
  std::printf("{\"variant\": \"%s\", \"fwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"peak_extra_bytes\": %lld}\n", variant,
              fwd, fwd_bwd, static_cast<long long>(peak));
  std::fflush(stdout);
}

void block_mask_line(const MaskMod& m, int64_t seq, int reps) {
  BlockMask bm;
  const double ms = median_ms([&] { bm = create_block_mask(m, 1, 1, seq, seq); }, reps);
  std::printf("{\"variant\": \"block_mask\", \"create_ms\": %.3f, \"sparsity\": %.4f, \"bytes\": %lld, \"seq\": %lld}\n",
              ms, bm.sparsity(), static_cast<long long>(bm.nbytes()), static_cast<long long>(seq));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t B = argc > 1 ? std::atoll(argv[1]) : 1, H = argc > 2 ? std::atoll(argv[2]) : 4,
                S = argc > 3 ? std::atoll(argv[3]) : 4096, D = argc > 4 ? std::atoll(argv[4]) : 64,
                W = argc > 5 ? std::atoll(argv[5]) : 256;
  manual_seed(0);
  const Tensor q = randn({B, H, S, D}).requires_grad_(), k = randn({B, H, S, D}).requires_grad_(),
               v = randn({B, H, S, D}).requires_grad_();
  const MaskMod m = sliding_window_mask(W);
  const BlockMask sparse = create_block_mask(m, 1, 1, S, S);
  run("flex", q, k, v, sparse, 5);
  run("dense", q, k, v, dense_mask(m, S, S), 2);
  block_mask_line(m, S, 5);
  block_mask_line(m, int64_t{1} << 20, 5);
  return 0;
}
