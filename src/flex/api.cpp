// flex_attention: validation, BlockMask resolution (moved to q's device, cached), dispatch to the
// CPU kernels or the NVRTC-compiled CUDA kernels (src/flex/cuda), autograd node.
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "flex/cpu/attention.h"
#include "flex/block_mask_impl.h"
#include "flex/cuda/attention_cuda.h"
#include "kiln/autograd.h"
#include "kiln/tuning.h"

namespace kiln::flex {
namespace {

constexpr const char* kOp = "flex_attention";

// Everything the kernels need, kept alive by the autograd node.
struct Prepared {
  cpu::Problem p;
  std::shared_ptr<detail::Program> score, mask;
  std::shared_ptr<cpu::MaskTiles> tiles;  // CPU: the partial tiles' mask bits (p.tiles), for both passes
  BlockMask block_mask;  // a copy (tensors are shared handles): the backward reads its q_* lists
  std::shared_ptr<cuda::State> cuda;  // CUDA: device buffers and compiled kernels
  BlockMask merged;                   // CUDA (cuda::BlockPlan::merge): block_mask's lists merged
  // CUDA (cuda::BlockPlan::forward_keeps): the caller's mask and its merged lists, which the forward
  // walks while block_mask is halved for the backward (kept alive for the kernels).
  BlockMask fwd_block_mask, fwd_merged;
};

// A BlockMask derived from `bm` (moved to a device, halved) by make(), from a small cache keyed by
// bm's tensors' identities and versions and by `key` (what else the result depends on), so a mask
// reused every step is derived once. Entries keep their source, so identities stay unique.
template <class Make>
BlockMask derived_mask(const BlockMask& bm, const std::string& key, Make make) {
  auto tensors = [](const BlockMask& m) {
    return std::vector<const Tensor*>{&m.kv_num_blocks, &m.kv_indices, &m.full_kv_num_blocks, &m.full_kv_indices,
                                      &m.q_num_blocks, &m.q_indices, &m.full_q_num_blocks, &m.full_q_indices};
  };
  struct Entry {
    BlockMask src, derived;
    std::string key;
    std::vector<uint64_t> versions;
  };
  static std::mutex mutex;
  static std::deque<Entry> cache;
  const std::vector<const Tensor*> ts = tensors(bm);
  std::vector<uint64_t> versions;
  for (const Tensor* t : ts) versions.push_back(t->defined() ? t->version() : 0);
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : cache) {
    const std::vector<const Tensor*> es = tensors(e.src);
    bool same = e.key == key && e.versions == versions;
    for (size_t i = 0; same && i < ts.size(); ++i) same = ts[i]->impl() == es[i]->impl();
    if (same) return e.derived;
  }
  Entry e{bm, make(), key, versions};
  cache.push_front(e);
  if (cache.size() > 8) cache.pop_back();
  return e.derived;
}

// `bm` with its tensors on `device`: as is when they are there already, else a cached copy.
BlockMask block_mask_on(const BlockMask& bm, Device device) {
  if (bm.kv_num_blocks.device() == device) return bm;
  BlockMask m = derived_mask(bm, "on " + device.str(), [&] { return bm.to(device); });
  m.mask_mod = bm.mask_mod;  // the tensors are shared; the mod and lengths are the caller's
  m.q_len = bm.q_len;
  m.kv_len = bm.kv_len;
  return m;
}

// detail::compile of a mod, cached by expression node while the tensors it captures keep their
// versions: a model calls flex_attention once per layer with the same mods, and compile copies
// every captured tensor to the host (with the interval pyramids the bounds proof builds, ~0.2 ms
// a call for a 32k-token document mask on the H200's host). Entries hold their Expr, so a node
// address is never reused while cached; pyramids are built before the Program is shared.
std::shared_ptr<detail::Program> compiled(const Expr& e) {
  struct Entry {
    Expr expr;
    std::vector<uint64_t> versions;  // of prog->buffers[i].src->tensor
    std::shared_ptr<detail::Program> prog;
  };
  static std::mutex mutex;
  static std::deque<Entry> cache;
  auto versions = [](const detail::Program& p) {
    std::vector<uint64_t> v;
    for (const detail::Buffer& b : p.buffers) v.push_back(b.src->tensor.version());
    return v;
  };
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    if (it->expr.node() != e.node()) continue;
    if (versions(*it->prog) == it->versions) return it->prog;
    cache.erase(it);  // a captured tensor changed in place: compile afresh
    break;
  }
  auto prog = std::make_shared<detail::Program>(detail::compile(e));
  for (const detail::Buffer& b : prog->buffers) b.build_pyramid();
  cache.push_front(Entry{e, versions(*prog), prog});
  if (cache.size() > 8) cache.pop_back();  // entries keep their captured tensors alive: a few suffice
  return prog;
}

// The CPU kernels' mask bits (cpu::MaskTiles), shared by the calls with the same BlockMask lists,
// compiled mask program (its captured values are copies, fixed per Program) and shape: every layer
// of a model attends with the step's one BlockMask, so its partial tiles are evaluated once a step.
template <typename F>
std::shared_ptr<cpu::MaskTiles> mask_tiles(const Prepared& pr, int64_t max_bytes) {
  const cpu::Problem& p = pr.p;
  if (!pr.mask) return nullptr;
  struct Entry {
    BlockMask bm;  // held, so its tensors' identities stay unique while cached
    std::shared_ptr<detail::Program> prog;
    std::vector<int64_t> key;
    std::shared_ptr<cpu::MaskTiles> tiles;
  };
  static std::mutex mutex;
  static std::deque<Entry> cache;
  const BlockMask& bm = pr.block_mask;
  const std::vector<int64_t> key = {p.B, p.Hq, p.L, p.S, p.QB, p.KB, static_cast<int64_t>(sizeof(F)),
                                    static_cast<int64_t>(bm.kv_num_blocks.version()),
                                    static_cast<int64_t>(bm.kv_indices.version())};
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Entry& e : cache)
      if (e.prog == pr.mask && e.key == key && e.bm.kv_num_blocks.impl() == bm.kv_num_blocks.impl() &&
          e.bm.kv_indices.impl() == bm.kv_indices.impl())
        return e.tiles;
  }
  std::shared_ptr<cpu::MaskTiles> tiles = cpu::MaskTiles::build<F>(p, max_bytes);
  std::lock_guard<std::mutex> lock(mutex);
  cache.push_front(Entry{bm, pr.mask, key, tiles});
  if (cache.size() > 4) cache.pop_back();  // a step's mask and a few more: each at most max_bytes
  return tiles;
}

#ifdef KILN_WITH_CUDA
// The (possibly halved) mask at 64-blocks for the CUDA kernels (cuda::BlockPlan::halve; the halving,
// detail::halve_blocks, lists a subset of the caller's blocks, so results are the same elements' sums).
void halve_for_cuda(Prepared& pr, Device device) {
  cpu::Problem& p = pr.p;
  const Expr& mod = pr.block_mask.mask_mod.expr;
  const std::shared_ptr<detail::Program> prog = pr.mask;
  // Keyed by the mod and its captured tensors' versions too: the halving reads their values.
  std::string key = "halved " + std::to_string(reinterpret_cast<uintptr_t>(mod.node().get()));
  for (const detail::Buffer& b : prog->buffers) key += " " + std::to_string(b.src->tensor.version());
  const BlockMask& bm = pr.block_mask;
  pr.block_mask = derived_mask(bm, key, [&] { return detail::halve_blocks(bm, *prog).to(device); });
  detail::use_block_mask(p, pr.block_mask);
}

// The mask's lists merged for the kernels' one-list walk (cuda::BlockPlan::merge), derived once per
// BlockMask.
void merge_lists_for_cuda(Prepared& pr, Device device) {
  cpu::Problem& p = pr.p;
  const BlockMask& bm = pr.block_mask;
  pr.merged = derived_mask(bm, "merged", [&] { return detail::merge_block_lists(bm).to(device); });
  detail::use_merged_lists(p, pr.merged);
}

// The CUDA plan of this call, decided once from the problem, the dtype, the device's architecture
// and the tuning values read here, then the state it is run with: the backward on the (possibly
// halved) mask, the forward on the caller's where the plan says so (its lists merged before the
// halving).
void prepare_cuda(Prepared& pr, const Tensor& q) {
  const Device device = q.device();
  cuda::check_supported(pr.p, q.dtype());
  const int major = cuda::device_major(device.index);
  const FlexTuning tuning = kiln::tuning().flex;
  // The halving evaluates the mask per BlockMask row: b / h only where the BlockMask has those dims.
  const Expr& mod = pr.block_mask.mask_mod.expr;
  const bool can_halve = (!mod.uses_b() || pr.p.mB == pr.p.B) && (!mod.uses_h() || pr.p.mH == pr.p.Hq);
  const cuda::BlockPlan blocks = cuda::block_plan_for(pr.p, major, can_halve, tuning);
  cpu::Problem fwd_p;
  if (blocks.forward_keeps) {
    merge_lists_for_cuda(pr, device);
    fwd_p = pr.p;
    pr.fwd_block_mask = pr.block_mask;
    pr.fwd_merged = pr.merged;
  }
  if (blocks.halve) halve_for_cuda(pr, device);
  if (blocks.merge) merge_lists_for_cuda(pr, device);
  const cpu::Problem* fwd = blocks.forward_keeps ? &fwd_p : nullptr;
  const cuda::Plan plan = cuda::plan_for(pr.p, fwd, q.dtype(), major, tuning);
  pr.cuda = cuda::make_state(pr.p, fwd, q.dtype(), device, plan);
}
#endif

std::shared_ptr<Prepared> prepare(const Tensor& q, const Tensor& k, const Tensor& v, const FlexOptions& o) {
  KILN_CHECK(q.defined() && k.defined() && v.defined(), kOp, "q, k and v must be defined");
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, kOp,
             "expected q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], got q ", shape_str(q.sizes()), ", k ",
             shape_str(k.sizes()), ", v ", shape_str(v.sizes()));
  KILN_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), kOp, "q, k and v must share a dtype, got ",
             dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  KILN_CHECK(is_floating_point(q.dtype()), kOp, "expected floating-point q, k, v, got ", dtype_name(q.dtype()));
  KILN_CHECK(q.device() == k.device() && q.device() == v.device(), kOp, "q, k and v must be on one device");
  KILN_CHECK(q.size(3) == k.size(3), kOp, "q and k head dims differ: ", q.size(3), " vs ", k.size(3));
  KILN_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0), kOp, "batch sizes differ: q ", shape_str(q.sizes()),
             ", k ", shape_str(k.sizes()), ", v ", shape_str(v.sizes()));
  KILN_CHECK(k.size(1) == v.size(1) && k.size(2) == v.size(2), kOp,
             "k and v must have the same heads and length: k ", shape_str(k.sizes()), ", v ", shape_str(v.sizes()));
  const int64_t Hq = q.size(1), Hkv = k.size(1);
  if (o.enable_gqa) {
    KILN_CHECK(Hkv >= 1 && Hq % Hkv == 0, kOp, "enable_gqa needs q heads a multiple of kv heads, got ", Hq, " and ",
               Hkv);
  } else {
    KILN_CHECK(Hq == Hkv, kOp, "q has ", Hq, " heads but k and v have ", Hkv, "; pass enable_gqa for grouped-query attention");
  }
  auto pr = std::make_shared<Prepared>();
  cpu::Problem& p = pr->p;
  p.B = q.size(0);
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.L = q.size(2);
  p.S = k.size(2);
  p.E = q.size(3);
  p.Ev = v.size(3);
  KILN_CHECK(p.L >= 1 && p.S >= 1 && p.E >= 1 && p.Ev >= 1 && p.B >= 1 && Hkv >= 1, kOp, "empty inputs: q ",
             shape_str(q.sizes()), ", k ", shape_str(k.sizes()), ", v ", shape_str(v.sizes()));
  p.scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(p.E));
  if (o.block_mask) {
    const BlockMask& bm = *o.block_mask;
    KILN_CHECK(bm.q_len == p.L && bm.kv_len == p.S, kOp, "block_mask was built for Q_LEN ", bm.q_len, ", KV_LEN ",
               bm.kv_len, " but q has length ", p.L, " and k ", p.S);
    KILN_CHECK(bm.batch() == 1 || bm.batch() == p.B, kOp, "block_mask batch ", bm.batch(), " does not match q batch ",
               p.B, " (use 1 to broadcast)");
    KILN_CHECK(bm.heads() == 1 || bm.heads() == p.Hq, kOp, "block_mask heads ", bm.heads(), " do not match q heads ",
               p.Hq, " (use 1 to broadcast)");
    pr->block_mask = block_mask_on(bm, q.device());
    detail::use_block_mask(p, pr->block_mask);
    const ExprNode& root = *pr->block_mask.mask_mod.expr.node();
    if (!(root.op == Op::ConstBool && root.ival == 1)) {
      pr->mask = compiled(pr->block_mask.mask_mod.expr);
      detail::check_mask_loads(*pr->mask, pr->block_mask.mask_mod.expr, kOp, p.B, p.Hq, p.L, p.S);
      p.mask = pr->mask.get();
    }
  } else {
    p.all_full = true;
    p.nQ = (p.L + p.QB - 1) / p.QB;
    p.nKV = (p.S + p.KB - 1) / p.KB;
  }
  if (!o.score_mod.is_identity()) {
    pr->score = compiled(o.score_mod.expr);
    p.score = pr->score.get();
  }
  if (q.is_cuda()) {
    KILN_CUDA_ONLY(kOp, prepare_cuda(*pr, q));
  }
  return pr;
}

// Contiguous, and on CUDA 16-byte aligned: the kernels read rows with TMA and 16-byte vectors, so
// a caller's view at an odd offset (a slice of a larger buffer) is copied rather than refused.
Tensor kernel_operand(const Tensor& t) {
  Tensor c = t.detach().contiguous();
  if (c.is_cuda() && reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

}  // namespace

// The CUDA kernels cover bf16/fp16, equal head dims of 64 or 128 and BlockMask blocks in
// multiples of 64; other CUDA calls run the CPU kernels on copies (through differentiable
// copies, so autograd is unchanged), as PyTorch's math fallback does.
bool cuda_kernels_cover(const Tensor& q, const Tensor& k, const Tensor& v, const FlexOptions& o) {
  const bool dtype_ok = q.dtype() == kBFloat16 || q.dtype() == kFloat16;
  const int64_t e = q.dim() == 4 ? q.size(3) : 0;
  const bool dims_ok = k.dim() == 4 && v.dim() == 4 && k.size(3) == e && v.size(3) == e && (e == 64 || e == 128);
  const bool blocks_ok = !o.block_mask || (o.block_mask->q_block_size % 64 == 0 && o.block_mask->kv_block_size % 64 == 0);
  return dtype_ok && dims_ok && blocks_ok;
}

FlexOutput flex_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const FlexOptions& options) {
  if (q_in.defined() && k_in.defined() && v_in.defined() && q_in.is_cuda() && k_in.is_cuda() && v_in.is_cuda() &&
      q_in.dtype() == k_in.dtype() && q_in.dtype() == v_in.dtype() && !cuda_kernels_cover(q_in, k_in, v_in, options)) {
    FlexOptions o = options;
    BlockMask on_cpu;
    if (o.block_mask) {
      on_cpu = block_mask_on(*o.block_mask, kCPU);
      o.block_mask = &on_cpu;
    }
    FlexOutput r = flex_attention(q_in.cpu(), k_in.cpu(), v_in.cpu(), o);
    r.out = r.out.to(q_in.device());
    if (r.lse.defined()) r.lse = r.lse.to(q_in.device());
    return r;
  }
  std::shared_ptr<Prepared> pr = prepare(q_in, k_in, v_in, options);
  const cpu::Problem& p = pr->p;
  const Tensor q = kernel_operand(q_in), k = kernel_operand(k_in), v = kernel_operand(v_in);
  const DType lse_dtype = q.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor out = empty({p.B, p.Hq, p.L, p.Ev}, q.options());
  Tensor lse = empty({p.B, p.Hq, p.L}, q.options().dtype(lse_dtype));
  bool index_error = false;
  if (q.is_cuda()) {
    KILN_CUDA_ONLY(kOp, index_error = !cuda::forward(*pr->cuda, q, k, v, out, lse));
  } else {
    dispatch_floating(q.dtype(), kOp, [&](auto tag) {
      using T = typename decltype(tag)::type;
      // The mask bits live as long as the node and the cache entry: at most the size of q (1 MB for
      // tiny inputs).
      const int64_t max_bytes = std::max<int64_t>(int64_t{1} << 20, q.numel() * static_cast<int64_t>(q.element_size()));
      pr->tiles = mask_tiles<acc_t<T>>(*pr, max_bytes);
      pr->p.tiles = pr->tiles.get();
      cpu::flex_forward<T>(p, q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), out.data_ptr<T>(),
                           lse.data_ptr<acc_t<T>>(), &index_error);
      if (pr->tiles && pr->tiles->index_error()) index_error = true;
    });
  }
  KILN_CHECK(!index_error, kOp, "a mod reads a captured tensor out of range (index clamped); check its shape");

  // Inputs of the node: q, k, v, then the score_mod's captured float tensors that require grad.
  std::vector<Tensor> inputs = {q_in, k_in, v_in};
  std::vector<int32_t> grad_bufs;
  if (pr->score)
    for (size_t x = 0; x < pr->score->buffers.size(); ++x)
      if (pr->score->buffers[x].needs_grad) {
        inputs.push_back(pr->score->buffers[x].src->tensor);
        grad_bufs.push_back(static_cast<int32_t>(x));
      }
  if (autograd::needs_grad(inputs)) {
    SavedTensor sq(q), sk(k), sv(v), so(out, true), sl(lse, true);
    autograd::record(kOp, {out, lse}, inputs, [pr, sq, sk, sv, so, sl, grad_bufs](const std::vector<Tensor>& g) {
      const Tensor qs = sq.unpack(kOp), ks = sk.unpack(kOp), vs = sv.unpack(kOp), o = so.unpack(kOp), l = sl.unpack(kOp);
      const cpu::Problem& pb = pr->p;
      std::vector<Tensor> grads = {empty(qs.sizes(), qs.options()), empty(ks.sizes(), ks.options()),
                                   empty(vs.sizes(), vs.options())};
      const Tensor dout = g[0].defined() ? kernel_operand(g[0].to(qs.dtype())) : Tensor();
      const Tensor dlse = g.size() > 1 && g[1].defined() ? g[1].contiguous().to(l.dtype()) : Tensor();
      std::vector<std::vector<double>> cap(pr->score ? pr->score->buffers.size() : 0);
      for (int32_t x : grad_bufs) cap[x].assign(static_cast<size_t>(pr->score->buffers[x].numel), 0.0);
      bool bad_index = false;
      if (qs.is_cuda()) {
        KILN_CUDA_ONLY(kOp, bad_index = !cuda::backward(*pr->cuda, qs, ks, vs, o, dout, l, dlse, grads[0], grads[1],
                                                        grads[2], cap));
      } else dispatch_floating(qs.dtype(), kOp, [&](auto tag) {
        using T = typename decltype(tag)::type;
        cpu::flex_backward<T>(pb, qs.data_ptr<T>(), ks.data_ptr<T>(), vs.data_ptr<T>(), o.data_ptr<T>(),
                              dout.defined() ? dout.data_ptr<T>() : nullptr, l.data_ptr<acc_t<T>>(),
                              dlse.defined() ? dlse.data_ptr<acc_t<T>>() : nullptr, grads[0].data_ptr<T>(),
                              grads[1].data_ptr<T>(), grads[2].data_ptr<T>(), cap, &bad_index);
      });
      KILN_CHECK(!bad_index, kOp, "a mod reads a captured tensor out of range (index clamped); check its shape");
      for (int32_t x : grad_bufs) {
        const Tensor& src = pr->score->buffers[x].src->tensor;
        Tensor gt = empty(src.sizes(), src.options());
        NoGradGuard ng;
        gt.copy_(from_blob(cap[x].data(), src.sizes(), kFloat64));
        grads.push_back(gt);
      }
      return grads;
    }, /*materialize_grads=*/false);  // an unused lse's gradient is skipped, not a zero tensor read
  }
  FlexOutput res;
  res.out = out;
  if (options.return_lse) res.lse = lse;
  return res;
}

namespace detail {

void use_block_mask(cpu::Problem& p, const BlockMask& m) {
  p.QB = m.q_block_size;
  p.KB = m.kv_block_size;
  p.mB = m.batch();
  p.mH = m.heads();
  p.kv_num = m.kv_num_blocks.data_ptr<int32_t>();
  p.kv_idx = m.kv_indices.data_ptr<int32_t>();
  p.fkv_num = m.full_kv_num_blocks.data_ptr<int32_t>();
  p.fkv_idx = m.full_kv_indices.data_ptr<int32_t>();
  p.q_num = m.q_num_blocks.data_ptr<int32_t>();
  p.q_idx = m.q_indices.data_ptr<int32_t>();
  p.fq_num = m.full_q_num_blocks.data_ptr<int32_t>();
  p.fq_idx = m.full_q_indices.data_ptr<int32_t>();
  p.kv_m = m.kv_indices.size(3);
  p.fkv_m = m.full_kv_indices.size(3);
  p.q_m = m.q_indices.size(3);
  p.fq_m = m.full_q_indices.size(3);
  p.nQ = (p.L + p.QB - 1) / p.QB;
  p.nKV = (p.S + p.KB - 1) / p.KB;
}

void use_merged_lists(cpu::Problem& p, const BlockMask& merged) {
  p.kv_all_num = merged.kv_num_blocks.data_ptr<int32_t>();
  p.kv_all_idx = merged.kv_indices.data_ptr<int32_t>();
  p.q_all_num = merged.q_num_blocks.data_ptr<int32_t>();
  p.q_all_idx = merged.q_indices.data_ptr<int32_t>();
  p.kv_all_m = merged.kv_indices.size(3);
  p.q_all_m = merged.q_indices.size(3);
}

}  // namespace detail

}  // namespace kiln::flex
