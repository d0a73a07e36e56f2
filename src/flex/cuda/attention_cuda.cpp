// Host side of the CUDA FlexAttention: builds the kernel parameter block from the problem, puts
// captured tensors on the device once (int64 / fp32 copies of compile()'s buffers, cached by tensor
// identity and version), gets the kernels for the generated source and the configuration
// kernel_config.cpp chooses (nvrtc.cpp caches) and launches them on the current stream.
// Backward: preprocess (delta), the dQ kernel beside the dK/dV kernel (a side stream), then for
// captured-tensor gradients the fixed-order slot reduction. Captured-gradient slots: one double
// copy of the gradient buffers per (slot CTA, warp), at most 256 MB; with no captured gradients
// each dK/dV unit is its own CTA.
#include "flex/cuda/attention_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <numbers>
#include <optional>

#include "core/cuda/check.h"
#include "core/cuda/side_stream.h"
#include "core/env.h"
#include "core/tensor_impl.h"
#include "flex/cuda/codegen.h"
#include "flex/cuda/kernel_config.h"
#include "flex/cuda/nvrtc.h"

namespace kiln::flex::cuda {

constexpr const char* kOp = "flex_attention";

struct State {
  cpu::Problem p;
  DType dtype = kBFloat16;
  Device device;
  FlexParams base{};
  std::vector<Tensor> buffers;  // device copies (kept alive)
  const FlexKernels* kernels = nullptr;
  int64_t fwd_smem = 0, bwd_smem = 0, bwd_dq_smem = 0, bwd_dkdv_smem = 0;
  int64_t mask_bits_words = 0;  // KILN_FLEX_MASK_BITS: the keep bits' size, else 0
  int fwd_threads = kThreads;
  int64_t fwd_q_tiles = 0;
  int64_t fwd_grid = 0;  // CTAs of the forward: one per q tile, or what fits at once (fwd_persist)
  int64_t grad_numel = 0;
  bool check_indices = false;  // a load may go out of range: read the kernel's flag back
  bool profile = false;        // KILN_FLEX_PROFILE: print the kernels' phase cycles
  KernelConfig cfg;            // what the kernels were generated for
  // The forward's own problem, parameters and configuration where it runs on the caller's BlockMask
  // while the backward's is halved (make_state's fwd_p); else copies of p, base and cfg.
  cpu::Problem fwd_p;
  FlexParams fwd_base{};
  KernelConfig fwd_cfg;
  int64_t fwd_mask_bits_words = 0;
};

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Measurement switches (core/env.h) whose errors name flex_attention.
bool env_flag(const char* var, bool dflt) { return kiln::detail::env_flag(kOp, var, dflt); }

// KILN_FLEX_PROFILE: one kernel's phase cycles (thread 0 of each CTA, summed) as one stderr line;
// names ends with nullptr, counters at `base` of the kProfileSlots.
void print_profile(const char* kernel, const std::vector<double>& c, int base, const char* const* names) {
  double total = 0;
  for (int i = 0; names[i]; ++i) total += c[base + i];
  std::fprintf(stderr, "flex %s profile (%.3g cycles):", kernel, total);
  for (int i = 0; names[i]; ++i) std::fprintf(stderr, " %s %.1f%%", names[i], total > 0 ? 100.0 * c[base + i] / total : 0.0);
  std::fprintf(stderr, "\n");
}

// The kernels' phase counters for one call when profiling (P.prof points at them), else undefined.
Tensor attach_profile_counters(const State& st, FlexParams& P) {
  if (!st.profile) return Tensor();
  Tensor counters = zeros({kProfileSlots}, TensorOptions().dtype(kInt64).device(st.device));
  P.prof = static_cast<unsigned long long*>(counters.data_ptr());
  return counters;
}

std::vector<double> read_counters(const Tensor& counters) { return counters.to(kCPU).to(kFloat64).to_vector(); }

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
  if (!st.check_indices) return Tensor();
  Tensor err = zeros({1}, TensorOptions().dtype(kInt32).device(st.device));
  P.err = err.data_ptr<int32_t>();
  return err;
}

bool read_error(const State& st, const Tensor& err) {
  if (!st.check_indices) return true;
  return err.to(kCPU).data_ptr<int32_t>()[0] == 0;  // synchronises: only loads not proven in range pay it
}

// What determines a configuration's source besides the mods' programs.
std::string config_id(const KernelConfig& cfg) {
  char id[200];
  std::snprintf(id, sizeof(id), "%d%d/%d/%dx%d/%dx%dx%d/%d%d%d/%d%d%d%d%d%d%d%d%d%d%d%d%d%d/%d%d%d/%d%d%d%d%d%d%d", cfg.bf16,
                cfg.profile, cfg.head_dim, cfg.tile_m, cfg.tile_n, cfg.fwd_tile_m, cfg.fwd_tile_n, cfg.fwd_mt,
                cfg.fwd_wgmma, cfg.bwd_wgmma, cfg.index_check, cfg.fwd_kbuf, cfg.bwd_kbuf, cfg.bwd_qbuf,
                cfg.fwd_overlap, cfg.fwd_tma, cfg.bwd_tma, cfg.index32, cfg.fwd_keepbits, cfg.walk_ahead,
                cfg.mask_bits, cfg.fwd_persist, cfg.fast_mods, cfg.bwd_paired, cfg.bwd_split_p,
                cfg.bwd_dkdv_min_blocks, cfg.bwd_dq_min_blocks, cfg.fwd_min_blocks, cfg.fast_mods && cfg.magic_i2f,
                cfg.fold_scale, cfg.fwd_last_issues, cfg.fwd_stages, cfg.merged_walk, cfg.mask_ranges,
                cfg.fwd_pingpong);
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

// The forward's shared memory, threads, q tiles and grid under cfg (its kernel loaded).
void size_forward(State& st, const cpu::Problem& p, const KernelConfig& cfg) {
  // wgmma's tiles are unpadded and start on a 1024-byte boundary (the kernel aligns them).
  // V and 1 or 2 K buffers; 2 of each with the overlap, and fwd_stages of each with TMA (fwd_kbuf 2).
  // The persistent forward: persist_stages() of each.
  const int64_t fwd_kv_tiles = cfg.fwd_persist                     ? 2 * cfg.persist_stages()
                               : cfg.fwd_tma && cfg.fwd_kbuf == 2 ? 2 * cfg.fwd_stages
                               : cfg.fwd_overlap                  ? 4
                                                                  : 1 + cfg.fwd_kbuf;
  st.fwd_smem = cfg.fwd_wgmma ? (cfg.fwd_tile_m + fwd_kv_tiles * cfg.fwd_tile_n) * p.E * 2 + 1024
                              : (cfg.fwd_tile_m + fwd_kv_tiles * cfg.fwd_tile_n) * padded_row(p.E) * 2;
  st.fwd_threads = cfg.fwd_threads() + (cfg.fwd_persist ? 128 : 0);  // the persistent forward's producer warpgroup
  st.fwd_q_tiles = ceil_div(p.L, cfg.fwd_tile_m);
}

}  // namespace

std::shared_ptr<State> make_state(const cpu::Problem& p, DType dtype, Device device, const cpu::Problem* fwd_p) {
  check_supported(p, dtype);
  auto st = std::make_shared<State>();
  st->p = p;
  st->dtype = dtype;
  st->device = device;
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
    for (size_t x = 0; x < p.score->buffers.size(); ++x)
      if (p.score->buffers[x].needs_grad) {
        P.sgoff[x] = st->grad_numel;
        st->grad_numel += p.score->buffers[x].numel;
      }
  }
  if (p.mask) upload(*p.mask, device, st->buffers, P.mptr, P.msize, P.mstride);
  auto unproven = [&](const detail::Program* prog) {
    return prog && !detail::loads_in_bounds(*prog, p.B, p.Hq, p.L, p.S);
  };
  st->check_indices = unproven(p.score) || unproven(p.mask);
  // Every captured tensor's largest flat offset below 2^31 (the kernels' 32-bit load offsets).
  auto offsets_fit = [](const detail::Program* prog) {
    if (!prog) return true;
    for (const detail::Buffer& buf : prog->buffers) {
      int64_t last = 0;
      for (int d = 0; d < 3; ++d) last += std::max<int64_t>(buf.sizes[d] - 1, 0) * std::abs(buf.strides[d]);
      if (last >= (int64_t{1} << 31)) return false;
    }
    return true;
  };
  const bool index32 = !st->check_indices && offsets_fit(p.score) && offsets_fit(p.mask);

  KernelConfig cfg = choose_kernel_config(p, dtype, device.index, st->check_indices, index32, st->grad_numel,
                                          &st->mask_bits_words);
  st->profile = cfg.profile;
  // The forward: on fwd_p's BlockMask (the same mods, lengths and heads) with its own configuration.
  st->fwd_p = fwd_p ? *fwd_p : p;
  st->fwd_base = P;
  st->fwd_cfg = cfg;
  st->fwd_mask_bits_words = st->mask_bits_words;
  if (fwd_p) {
    set_block_lists(st->fwd_base, *fwd_p);
    st->fwd_cfg = choose_kernel_config(*fwd_p, dtype, device.index, st->check_indices, index32, st->grad_numel,
                                       &st->fwd_mask_bits_words);
  }
  size_forward(*st, st->fwd_p, st->fwd_cfg);
  // dQ's Q, dO, V and 1 or 2 K buffers (TMA: 1 or 2 K and as many V); dK/dV's K, V and 1 or 2 sets
  // of Q, dO and lse2 / delta rows (two with TMA). The kernels' attribute takes the larger.
  const auto tiles_bytes = [&](int64_t tiles) {
    return cfg.bwd_wgmma ? tiles * kTileM * p.E * 2 + 1024 : tiles * kTileM * padded_row(p.E) * 2;
  };
  const int64_t q_sets = cfg.bwd_tma ? 2 : cfg.bwd_qbuf;
  st->bwd_dq_smem = tiles_bytes(cfg.bwd_tma ? 2 + 2 * cfg.bwd_kbuf : 3 + cfg.bwd_kbuf);
  st->bwd_dkdv_smem = tiles_bytes(2 + 2 * q_sets) + 2 * kTileM * 4 * q_sets;
  st->bwd_smem = std::max(st->bwd_dq_smem, st->bwd_dkdv_smem);
  st->cfg = cfg;
  st->kernels = &kernels_for(p, cfg, fwd_p ? &st->fwd_cfg : nullptr, device.index, st->fwd_smem, st->bwd_smem);
  st->fwd_grid = p.B * p.Hq * st->fwd_q_tiles;
  int sms = 0;  // the persistent kernels' CTAs: what fits the SMs at once
  if (st->fwd_cfg.fwd_persist)
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index));
  if (st->fwd_cfg.fwd_persist) {
    const int per_sm = max_active_blocks(st->kernels->fwd, st->fwd_threads, st->fwd_smem);
    st->fwd_grid = std::min<int64_t>(st->fwd_grid, int64_t{sms} * std::max(per_sm, 1));
  }
  return st;
}

namespace {

// KILN_FLEX_MASK_BITS: flex_mask_bits writes the partial blocks' keep bits into a buffer that
// P.mbits points at (returned, to live until the kernels that read it have run); else nothing.
// `words` and `p`: the forward's (State::fwd_*) or the backward's.
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
  if (st.fwd_cfg.fwd_tma) {  // the maps hold the tensors' addresses: encoded per call (host only, ~microseconds)
    const bool bf16 = st.dtype == kBFloat16;
    const KernelConfig& c = st.fwd_cfg;
    encode_tile_map(P.qmap, P.q, bf16, st.p.B * st.p.Hq, st.p.L, st.p.E, c.fwd_tile_m);
    encode_tile_map(P.kmap, P.k, bf16, st.p.B * st.p.Hkv, st.p.S, st.p.E, c.fwd_tile_n);
    encode_tile_map(P.vmap, P.v, bf16, st.p.B * st.p.Hkv, st.p.S, st.p.E, c.fwd_tile_n);
    // The persistent forward stores its output tiles by TMA (out is kiln's own, contiguous).
    if (c.fwd_persist) encode_tile_map(P.omap, P.out, bf16, st.p.B * st.p.Hq, st.p.L, st.p.E, c.fwd_tile_m);
  }
  const Tensor bits = launch_mask_bits(st, st.fwd_p, st.fwd_mask_bits_words, P, stream_of(st));
  const Tensor prof = attach_profile_counters(st, P);
  launch(st.kernels->fwd, st.fwd_grid, st.fwd_threads, st.fwd_smem, stream_of(st), &P);
  if (st.profile) {
    static const char* const names[] = {"prologue", "wait K", "S=QK^T", "softmax", "wait V", "PV", "epilogue", nullptr};
    print_profile("fwd", read_counters(prof), 0, names);
  }
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
  if (st.cfg.bwd_tma) {  // the backward's 64-row boxes
    const bool bf16 = st.dtype == kBFloat16;
    encode_tile_map(P.qmap, P.q, bf16, p.B * p.Hq, p.L, p.E, kTileM);
    encode_tile_map(P.domap, P.dout, bf16, p.B * p.Hq, p.L, p.E, kTileM);
    encode_tile_map(P.kmap, P.k, bf16, p.B * p.Hkv, p.S, p.E, kTileN);
    encode_tile_map(P.vmap, P.v, bf16, p.B * p.Hkv, p.S, p.E, kTileN);
  }

  const Tensor bits = launch_mask_bits(st, st.p, st.mask_bits_words, P, stream);  // the dQ kernel's, as the forward's
  const Tensor prof = attach_profile_counters(st, P);
  const int64_t rows = p.B * p.Hq * p.L;
  // E / 8 lanes a row, kPreRows rows a lane group
  launch(st.kernels->bwd_pre, ceil_div(rows, kThreads / (p.E / 8) * kPreRows), kThreads, 0, stream, &P);
  // The captured-tensor gradient slots, zeroed on the main stream before the side stream follows it.
  P.units = p.B * p.Hkv * P.kv_tiles;
  const bool cap = st.grad_numel > 0;
  Tensor slots, capgrad;
  int64_t grid = P.units;
  if (cap) {
    const int64_t budget = (int64_t{256} << 20) / (8 * kWarps * st.grad_numel);
    P.nslots = std::clamp<int64_t>(budget, 1, std::min<int64_t>(P.units, 2048));
    P.grad_numel = st.grad_numel;
    slots = zeros({P.nslots * kWarps * st.grad_numel}, dev.dtype(kFloat64));
    capgrad = empty({st.grad_numel}, dev.dtype(kFloat64));
    P.slots = slots.data_ptr<double>();
    P.capgrad = capgrad.data_ptr<double>();
    grid = P.nslots;
  }
  // The dK/dV kernel on a side stream beside the dQ kernel (they share only read-only inputs): each
  // fills the other's last wave and launch gaps (H200, session 11, fwd+bwd: 16 documents 5.74 ->
  // 5.46 ms, causal 4x16x8192 10.37 -> 10.18, window E 64 0.58 -> 0.56; the rest within noise).
  // KILN_FLEX_BWD_CONCURRENT=0 runs them in turn, as does the profile (one kernel at a time).
  std::optional<kiln::cuda::SideStream> side;
  if (!st.profile && env_flag("KILN_FLEX_BWD_CONCURRENT", true)) {
    side.emplace(st.device.index, stream);
    side->follow();  // after the preprocess (delta, lse2) and the slots' zeros
  }
  launch(st.kernels->bwd_dq, p.B * p.Hq * P.q_tiles, kThreads, st.bwd_dq_smem, stream, &P);
  launch(st.kernels->bwd_dkdv, grid, kThreads, st.bwd_dkdv_smem, side ? side->stream() : stream, &P);
  if (side) side->join();
  if (st.profile) {
    static const char* const dq_phases[] = {"prologue", "wait V", "dP=dO V^T", "wait K",
                                            "S=QK^T",   "dS",     "dQ+=dS K",  "epilogue", nullptr};
    static const char* const dkdv_phases[] = {"prologue",    "wait Q",     "S^T=K Q^T",         "wait dO", "dP^T",
                                              "P, dS",       "dK+=dS^T Q", "dV+=P^T dO, loads", nullptr};
    const std::vector<double> c = read_counters(prof);
    print_profile("bwd dq", c, 8, dq_phases);
    print_profile("bwd dkdv", c, 16, dkdv_phases);
  }
  if (cap) {
    launch(st.kernels->capgrad_reduce, ceil_div(st.grad_numel, 256), 256, 0, stream, &P);
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
