// Host side of the CUDA FlexAttention: builds the kernel parameter block from the problem, puts
// captured tensors on the device once (int64 / fp32 copies of compile()'s buffers, cached by tensor
// identity and version), gets the kernels for the generated source of the call's plan
// (kernel_config.h; nvrtc.cpp caches) and launches them on the current stream.
// Backward: preprocess (delta), the dQ kernel beside the dK/dV kernel (a side stream), then for
// captured-tensor gradients the fixed-order slot reduction. Captured-gradient slots: one double
// copy of the gradient buffers per (slot CTA, warp), at most 256 MB; with no captured gradients
// each dK/dV unit is its own CTA.
#include "flex/cuda/attention_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <numbers>

#include "core/cuda/check.h"
#include "core/cuda/side_stream.h"
#include "core/tensor_impl.h"
#include "flex/cuda/codegen.h"
#include "flex/cuda/nvrtc.h"

namespace kiln::flex::cuda {

constexpr const char* kOp = "flex_attention";

struct State {
  cpu::Problem p;  // the backward's problem
  DType dtype = kBFloat16;
  Device device;
  Plan plan;  // what the kernels were generated and are launched for
  FlexParams base{};
  std::vector<Tensor> buffers;  // device copies (kept alive)
  const FlexKernels* kernels = nullptr;
  int64_t fwd_smem = 0, bwd_smem = 0, bwd_dq_smem = 0, bwd_dkdv_smem = 0;
  int fwd_threads = kThreads;
  int64_t fwd_q_tiles = 0;
  int64_t fwd_grid = 0;  // CTAs of the forward: one per q tile, or what fits at once (fwd_persist)
  // The forward's own problem and parameters where it runs on the caller's BlockMask while the
  // backward's is halved (plan.separate_forward); else copies of p and base.
  cpu::Problem fwd_p;
  FlexParams fwd_base{};
};

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The device copy of a captured tensor's prepared values (fp32 for floats, int64 otherwise), from
// a small cache keyed by the tensor's identity and version: a mod reused every step uploads once.
Tensor device_buffer(const detail::Buffer& buf, Device device) {
  struct Entry {
    Tensor src;  // keeps the identity unique while cached
    uint64_t version;
    Device device;
    Tensor dev;
  };
  static std::mutex mutex;
  static std::deque<Entry> cache;
  const Tensor& src = buf.src->tensor;
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : cache)
    if (e.src.impl() == src.impl() && e.version == src.version() && e.device == device) return e.dev;
  Tensor host = buf.kind == Kind::Float ? from_blob(const_cast<float*>(buf.fvals.data()), {buf.numel}, kFloat32)
                                        : from_blob(const_cast<int64_t*>(buf.ivals.data()), {buf.numel}, kInt64);
  Entry e{src, src.version(), device, host.to(device)};
  cache.push_front(e);
  if (cache.size() > 32) cache.pop_back();
  return e.dev;
}

// Fills one program's pointer / size / stride arrays with its device buffers.
void upload(const detail::Program& prog, Device device, std::vector<Tensor>& keep, const void** ptr,
            int64_t (*size)[3], int64_t (*stride)[3]) {
  for (size_t x = 0; x < prog.buffers.size(); ++x) {
    const detail::Buffer& buf = prog.buffers[x];
    Tensor dev = device_buffer(buf, device);
    ptr[x] = dev.data_ptr();
    for (int d = 0; d < 3; ++d) {
      size[x][d] = buf.sizes[d];
      stride[x][d] = buf.strides[d];
    }
    keep.push_back(dev);
  }
}

void* stream_of(const State& st) { return kiln::cuda::current_raw_stream(st.device.index); }

// The kernels' out-of-range flag (P.err), zeroed, where a mod's loads are not proven in range
// (KILN_INDEX_CHECK); else undefined and P.err null: its memset cost ~10 us of host time a call.
Tensor attach_error_flag(const State& st, FlexParams& P) {
  if (!st.plan.check_indices) return Tensor();
  Tensor err = zeros({1}, TensorOptions().dtype(kInt32).device(st.device));
  P.err = err.data_ptr<int32_t>();
  return err;
}

bool read_error(const State& st, const Tensor& err) {
  if (!st.plan.check_indices) return true;
  return err.to(kCPU).data_ptr<int32_t>()[0] == 0;  // synchronises: only loads not proven in range pay it
}

// What determines a configuration's source besides the mods' programs.
std::string config_id(const KernelConfig& cfg) {
  char id[96];
  std::snprintf(id, sizeof(id), "%d/%d/%dx%d/%d%d%d%d%d%d%d%d%d%d%d%d/%d%d%d", cfg.bf16, cfg.head_dim, cfg.fwd_tile_m,
                cfg.fwd_tile_n, cfg.wgmma, cfg.index_check, cfg.index32, cfg.fwd_keepbits, cfg.fwd_persist,
                cfg.fwd_last_issues, cfg.mask_bits, cfg.mask_ranges, cfg.merged_walk, cfg.bwd_split_p, cfg.fast_mods,
                cfg.fold_scale, cfg.bwd_dkdv_min_blocks, cfg.bwd_dq_min_blocks, cfg.fwd_min_blocks);
  return id;
}

// The kernels of (the mods' compiled programs, cfg) on a device, the forward's from *fwd_cfg where
// the forward has its own configuration (it runs on the caller's BlockMask), else from cfg.
// generate_source and load_kernels' hash of its ~47 KB cost tens of microseconds of host time per
// call, so the lookup goes by an id of what determines the sources: the programs' unique ids and the
// configurations.
const FlexKernels& kernels_for(const cpu::Problem& p, const KernelConfig& cfg, const KernelConfig* fwd_cfg, int device,
                               int64_t fwd_smem, int64_t bwd_smem) {
  std::string id = "s" + std::to_string(p.score ? p.score->id : 0) + "/m" + std::to_string(p.mask ? p.mask->id : 0) +
                   "/" + config_id(cfg);
  if (fwd_cfg) id += " fwd " + config_id(*fwd_cfg);
  return load_kernels_by_id(
      id,
      [&] {
        std::string bwd = generate_source(p.score, p.mask, cfg);
        std::string fwd = fwd_cfg ? generate_source(p.score, p.mask, *fwd_cfg) : bwd;
        return SourcePair(std::move(fwd), std::move(bwd));
      },
      device, fwd_smem, bwd_smem);
}

}  // namespace

void check_supported(const cpu::Problem& p, DType dtype) {
  KILN_CHECK(dtype == kBFloat16 || dtype == kFloat16, kOp, "on CUDA q, k, v must be bfloat16 or float16, got ",
             dtype_name(dtype), " (run other dtypes on the CPU)");
  KILN_CHECK(p.E == p.Ev && (p.E == 64 || p.E == 128), kOp,
             "on CUDA the head dims must be equal and 64 or 128, got E = ", p.E, ", Ev = ", p.Ev,
             " (other head dims run on the CPU)");
  KILN_CHECK(p.QB % kTileM == 0 && p.KB % kTileN == 0, kOp, "on CUDA BlockMask block sizes must be multiples of ",
             kTileM, ", got ", p.QB, " x ", p.KB);
}

namespace {

// A padded tile row of the mma.sync paths (the kernels' LD), in elements.
int64_t padded_row(int64_t E) { return E + 8; }

// P's BlockMask fields from p (its lists' device pointers; all_full: none).
void set_block_lists(FlexParams& P, const cpu::Problem& p) {
  P.QB = p.QB;
  P.KB = p.KB;
  P.nQB = p.nQ;
  P.nKVB = p.nKV;
  P.mB = p.mB;
  P.mH = p.mH;
  P.all_full = p.all_full ? 1 : 0;
  if (p.all_full) return;
  P.kv_num = p.kv_num;
  P.kv_idx = p.kv_idx;
  P.fkv_num = p.fkv_num;
  P.fkv_idx = p.fkv_idx;
  P.q_num = p.q_num;
  P.q_idx = p.q_idx;
  P.fq_num = p.fq_num;
  P.fq_idx = p.fq_idx;
  P.kv_m = p.kv_m;
  P.fkv_m = p.fkv_m;
  P.q_m = p.q_m;
  P.fq_m = p.fq_m;
  P.kv_all_num = p.kv_all_num;
  P.kv_all_idx = p.kv_all_idx;
  P.q_all_num = p.q_all_num;
  P.q_all_idx = p.q_all_idx;
  P.kv_all_m = p.kv_all_m;
  P.q_all_m = p.q_all_m;
}

// The forward's shared memory, threads and q tiles under cfg: Q and the K / V stages (two of each
// by TMA, the persistent forward's persist_stages(); one K and one V by cp.async). wgmma's tiles are
// unpadded and start on a 1024-byte boundary (the kernel aligns them).
void size_forward(State& st, const cpu::Problem& p, const KernelConfig& cfg) {
  const int64_t kv_tiles = cfg.fwd_persist ? 2 * cfg.persist_stages() : cfg.wgmma ? 2 * 2 : 2;
  st.fwd_smem = cfg.wgmma ? (cfg.fwd_tile_m + kv_tiles * cfg.fwd_tile_n) * p.E * 2 + 1024
                          : (cfg.fwd_tile_m + kv_tiles * cfg.fwd_tile_n) * padded_row(p.E) * 2;
  st.fwd_threads = cfg.fwd_threads() + (cfg.fwd_persist ? 128 : 0);  // the persistent forward's producer warpgroup
  st.fwd_q_tiles = ceil_div(p.L, cfg.fwd_tile_m);
}

// The backward's shared memory: dQ's Q, dO, K and V (by TMA two K and two V buffers); dK/dV's K, V
// and one set of Q, dO and lse2 / delta rows (two by TMA). The kernels' attribute takes the larger.
void size_backward(State& st, const cpu::Problem& p, const KernelConfig& cfg) {
  const auto tiles_bytes = [&](int64_t tiles) {
    return cfg.wgmma ? tiles * kTileM * p.E * 2 + 1024 : tiles * kTileM * padded_row(p.E) * 2;
  };
  const int64_t q_sets = cfg.wgmma ? 2 : 1;
  st.bwd_dq_smem = tiles_bytes(cfg.wgmma ? 6 : 4);
  st.bwd_dkdv_smem = tiles_bytes(2 + 2 * q_sets) + 2 * kTileM * 4 * q_sets;
  st.bwd_smem = std::max(st.bwd_dq_smem, st.bwd_dkdv_smem);
}

}  // namespace

int device_major(int device) {
  int major = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

std::shared_ptr<State> make_state(const cpu::Problem& p, const cpu::Problem* fwd_p, DType dtype, Device device,
                                  const Plan& plan) {
  check_supported(p, dtype);
  KILN_CHECK(plan.separate_forward == (fwd_p != nullptr), kOp, "the plan and the forward's problem disagree");
  auto st = std::make_shared<State>();
  st->p = p;
  st->dtype = dtype;
  st->device = device;
  st->plan = plan;
  kiln::cuda::DeviceGuard guard(device.index);
  FlexParams& P = st->base;
  P.B = p.B;
  P.Hq = p.Hq;
  P.Hkv = p.Hkv;
  P.L = p.L;
  P.S = p.S;
  P.G = p.group();
  set_block_lists(P, p);
  P.q_tiles = ceil_div(p.L, kTileM);   // the dQ kernel's units
  P.kv_tiles = ceil_div(p.S, kTileN);  // the dK/dV kernel's units
  P.scale = p.scale;
  P.scale_f = static_cast<float>(p.scale);
  P.scale_log2e = static_cast<float>(p.scale * std::numbers::log2e);
  if (p.score) {
    upload(*p.score, device, st->buffers, P.sptr, P.ssize, P.sstride);
    int64_t offset = 0;
    for (size_t x = 0; x < p.score->buffers.size(); ++x)
      if (p.score->buffers[x].needs_grad) {
        P.sgoff[x] = offset;
        offset += p.score->buffers[x].numel;
      }
  }
  if (p.mask) upload(*p.mask, device, st->buffers, P.mptr, P.msize, P.mstride);
  // The forward: on fwd_p's BlockMask (the same mods, lengths and heads) with its own configuration.
  st->fwd_p = fwd_p ? *fwd_p : p;
  st->fwd_base = P;
  if (fwd_p) set_block_lists(st->fwd_base, *fwd_p);
  size_forward(*st, st->fwd_p, plan.fwd);
  size_backward(*st, p, plan.bwd);
  st->kernels = &kernels_for(p, plan.bwd, plan.separate_forward ? &plan.fwd : nullptr, device.index, st->fwd_smem,
                             st->bwd_smem);
  st->fwd_grid = p.B * p.Hq * st->fwd_q_tiles;
  if (plan.fwd.fwd_persist) {  // the persistent forward's CTAs: what fits the SMs at once
    int sms = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index));
    const int per_sm = max_active_blocks(st->kernels->fwd, st->fwd_threads, st->fwd_smem);
    st->fwd_grid = std::min<int64_t>(st->fwd_grid, int64_t{sms} * std::max(per_sm, 1));
  }
  return st;
}

namespace {

// KernelConfig::mask_bits: flex_mask_bits writes the partial blocks' keep bits into a buffer that
// P.mbits points at (returned, to live until the kernels that read it have run); else nothing.
// `words` and `p`: the forward's (Plan::fwd_mask_bits_words, State::fwd_p) or the backward's.
Tensor launch_mask_bits(const State& st, const cpu::Problem& p, int64_t words, FlexParams& P, void* stream) {
  if (words == 0) return Tensor();
  Tensor bits = empty({words}, TensorOptions().dtype(kInt32).device(st.device));
  P.mbits = static_cast<uint32_t*>(bits.data_ptr());
  launch(st.kernels->mask_bits, p.mB * p.mH * p.nQ * p.kv_m, 128, 0, stream, &P);
  return bits;
}

}  // namespace

bool forward(const State& st, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse) {
  kiln::cuda::DeviceGuard guard(st.device.index);
  FlexParams P = st.fwd_base;  // the forward's BlockMask (State::fwd_p)
  const Tensor err = attach_error_flag(st, P);
  P.q = q.data_ptr();
  P.k = k.data_ptr();
  P.v = v.data_ptr();
  P.out = out.data_ptr();
  P.lse = lse.data_ptr<float>();
  if (st.plan.fwd.wgmma) {  // the maps hold the tensors' addresses: encoded per call (host only, ~microseconds)
    const bool bf16 = st.dtype == kBFloat16;
    const KernelConfig& c = st.plan.fwd;
    encode_tile_map(P.qmap, P.q, bf16, st.p.B * st.p.Hq, st.p.L, st.p.E, c.fwd_tile_m);
    encode_tile_map(P.kmap, P.k, bf16, st.p.B * st.p.Hkv, st.p.S, st.p.E, c.fwd_tile_n);
    encode_tile_map(P.vmap, P.v, bf16, st.p.B * st.p.Hkv, st.p.S, st.p.E, c.fwd_tile_n);
    // The persistent forward stores its output tiles by TMA (out is kiln's own, contiguous).
    if (c.fwd_persist) encode_tile_map(P.omap, P.out, bf16, st.p.B * st.p.Hq, st.p.L, st.p.E, c.fwd_tile_m);
  }
  const Tensor bits = launch_mask_bits(st, st.fwd_p, st.plan.fwd_mask_bits_words, P, stream_of(st));
  launch(st.kernels->fwd, st.fwd_grid, st.fwd_threads, st.fwd_smem, stream_of(st), &P);
  return read_error(st, err);
}

bool backward(const State& st, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout_in, const Tensor& lse, const Tensor& dlse, Tensor& dq, Tensor& dk, Tensor& dv,
              std::vector<std::vector<double>>& cap_grads) {
  kiln::cuda::DeviceGuard guard(st.device.index);
  const cpu::Problem& p = st.p;
  void* stream = stream_of(st);
  FlexParams P = st.base;
  const TensorOptions dev = TensorOptions().device(st.device);
  const Tensor err = attach_error_flag(st, P);
  const Tensor dout = dout_in.defined() ? dout_in : zeros(out.sizes(), out.options());
  const Tensor delta = empty({2, p.B * p.Hq * p.L}, dev.dtype(kFloat32));  // delta, then lse2
  P.q = q.data_ptr();
  P.k = k.data_ptr();
  P.v = v.data_ptr();
  P.out = const_cast<void*>(out.data_ptr());
  P.lse = lse.data_ptr<float>();
  P.dout = dout.data_ptr();
  P.dlse = dlse.defined() ? dlse.data_ptr<float>() : nullptr;
  P.delta = delta.data_ptr<float>();
  P.lse2 = P.delta + p.B * p.Hq * p.L;
  P.dq = dq.data_ptr();
  P.dk = dk.data_ptr();
  P.dv = dv.data_ptr();
  if (st.plan.bwd.wgmma) {  // the backward's 64-row boxes
    const bool bf16 = st.dtype == kBFloat16;
    encode_tile_map(P.qmap, P.q, bf16, p.B * p.Hq, p.L, p.E, kTileM);
    encode_tile_map(P.domap, P.dout, bf16, p.B * p.Hq, p.L, p.E, kTileM);
    encode_tile_map(P.kmap, P.k, bf16, p.B * p.Hkv, p.S, p.E, kTileN);
    encode_tile_map(P.vmap, P.v, bf16, p.B * p.Hkv, p.S, p.E, kTileN);
  }

  const Tensor bits = launch_mask_bits(st, st.p, st.plan.bwd_mask_bits_words, P, stream);  // the dQ kernel's
  const int64_t rows = p.B * p.Hq * p.L;
  // E / 8 lanes a row, kPreRows rows a lane group
  launch(st.kernels->bwd_pre, ceil_div(rows, kThreads / (p.E / 8) * kPreRows), kThreads, 0, stream, &P);
  // The captured-tensor gradient slots, zeroed on the main stream before the side stream follows it.
  P.units = p.B * p.Hkv * P.kv_tiles;
  const int64_t grad_numel = st.plan.grad_numel;
  Tensor slots, capgrad;
  int64_t grid = P.units;
  if (grad_numel > 0) {
    const int64_t budget = (int64_t{256} << 20) / (8 * kWarps * grad_numel);
    P.nslots = std::clamp<int64_t>(budget, 1, std::min<int64_t>(P.units, 2048));
    P.grad_numel = grad_numel;
    slots = zeros({P.nslots * kWarps * grad_numel}, dev.dtype(kFloat64));
    capgrad = empty({grad_numel}, dev.dtype(kFloat64));
    P.slots = slots.data_ptr<double>();
    P.capgrad = capgrad.data_ptr<double>();
    grid = P.nslots;
  }
  // The dK/dV kernel on a side stream beside the dQ kernel (they share only read-only inputs): each
  // fills the other's last wave and launch gaps (H200, fwd+bwd: 16 documents 5.74 -> 5.46 ms, causal
  // 4x16x8192 10.37 -> 10.18, window E 64 0.58 -> 0.56; the rest within noise).
  kiln::cuda::SideStream side(st.device.index, stream);
  side.follow();  // after the preprocess (delta, lse2) and the slots' zeros
  launch(st.kernels->bwd_dq, p.B * p.Hq * P.q_tiles, kThreads, st.bwd_dq_smem, stream, &P);
  launch(st.kernels->bwd_dkdv, grid, kThreads, st.bwd_dkdv_smem, side.stream(), &P);
  side.join();
  if (grad_numel > 0) {
    launch(st.kernels->capgrad_reduce, ceil_div(grad_numel, 256), 256, 0, stream, &P);
    const Tensor host = capgrad.to(kCPU);
    const double* h = host.data_ptr<double>();
    for (size_t x = 0; x < p.score->buffers.size(); ++x) {
      if (!p.score->buffers[x].needs_grad || x >= cap_grads.size() || cap_grads[x].empty()) continue;
      std::memcpy(cap_grads[x].data(), h + P.sgoff[x], cap_grads[x].size() * sizeof(double));
    }
  }
  return read_error(st, err);
}

}  // namespace kiln::flex::cuda
