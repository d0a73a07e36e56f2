// BlockMask creation: each q-block row starts with the whole kv range and splits it in halves
// until interval analysis of the mask decides a run of blocks (all empty or all full) or a single
// block remains (partial; evaluated densely only when the mask reads captured tensors). The cost
// follows the number of mask boundaries per row (O(log nKV) each), not L×S. Rows run in parallel.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <sstream>

#include "core/tensor_impl.h"
#include "flex/block_mask_impl.h"
#include "flex/ir.h"

namespace kiln::flex {
namespace {

struct RowClassifier {
  const detail::Program& prog;
  int64_t L, S, bs, nKV;
  std::vector<detail::Interval> regs;
  std::unique_ptr<detail::RowEval<double>> dense;
  int64_t b = 0, h = 0, q0 = 0, q1 = 0;
  std::vector<int32_t>* part = nullptr;
  std::vector<int32_t>* full = nullptr;

  void recurse(int64_t j0, int64_t j1) {
    const int64_t k0 = j0 * bs, k1 = std::min(S, j1 * bs) - 1;
    const detail::Interval iv = detail::eval_interval(prog, b, h, q0, q1, k0, k1, regs);
    if (!iv.can_true) return;
    if (!iv.can_false) {
      for (int64_t j = j0; j < j1; ++j) full->push_back(static_cast<int32_t>(j));
      return;
    }
    if (j1 - j0 == 1) {
      if (!prog.reads_tensors) {
        part->push_back(static_cast<int32_t>(j0));
        return;
      }
      if (!dense) dense = std::make_unique<detail::RowEval<double>>(prog, bs);
      bool any_true = false, any_false = false;
      for (int64_t q = q0; q <= q1 && !(any_true && any_false); ++q) {
        dense->run(b, h, q, k0, k1 - k0 + 1, nullptr);
        const uint8_t* r = dense->bool_result();
        for (int64_t c = 0; c <= k1 - k0; ++c) (r[c] ? any_true : any_false) = true;
      }
      if (any_true) (any_false ? part : full)->push_back(static_cast<int32_t>(j0));
      return;
    }
    const int64_t mid = (j0 + j1) / 2;
    recurse(j0, mid);
    recurse(mid, j1);
  }

  // Classifies the row, splitting first at the previous row's partial blocks and their right
  // neighbours (`hint`, ascending): mask boundaries move little from one q block to the next, so
  // most rows cost a handful of evaluations instead of O(log nKV) per boundary. Every segment is
  // still decided by evaluation; the hint only picks where to cut.
  void row(const std::vector<int32_t>* hint) {
    if (!hint || hint->empty()) {
      recurse(0, nKV);
      return;
    }
    int64_t j = 0;
    for (size_t x = 0; x < hint->size(); ++x) {
      for (int64_t c = (*hint)[x]; c <= (*hint)[x] + 1 && c < nKV; ++c) {
        if (c < j) continue;
        if (j < c) recurse(j, c);
        recurse(c, c + 1);
        j = c + 1;
      }
    }
    if (j < nKV) recurse(j, nKV);
  }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Writes rows of lists into a padded [B, H, rows, max] int32 tensor plus the counts [B, H, rows].
void pack(const std::vector<std::vector<int32_t>>& lists, int64_t B, int64_t H, int64_t rows, Tensor& num,
          Tensor& idx) {
  size_t mx = 1;
  for (const auto& l : lists) mx = std::max(mx, l.size());
  num = zeros({B, H, rows}, kInt32);
  idx = zeros({B, H, rows, static_cast<int64_t>(mx)}, kInt32);
  int32_t* n = num.data_ptr<int32_t>();
  int32_t* x = idx.data_ptr<int32_t>();
  for (size_t r = 0; r < lists.size(); ++r) {
    n[r] = static_cast<int32_t>(lists[r].size());
    std::copy(lists[r].begin(), lists[r].end(), x + r * mx);
  }
}

// Transposes per-q-row kv lists into per-kv-column q lists (ascending q, since rows go in order).
std::vector<std::vector<int32_t>> transpose(const std::vector<std::vector<int32_t>>& rows, int64_t BH, int64_t nQ,
                                            int64_t nKV) {
  std::vector<std::vector<int32_t>> cols(static_cast<size_t>(BH * nKV));
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < nQ; ++i)
      for (int32_t j : rows[bh * nQ + i]) cols[bh * nKV + j].push_back(static_cast<int32_t>(i));
  return cols;
}

std::vector<std::vector<int32_t>> unpack(const Tensor& num_t, const Tensor& idx_t, const char* what) {
  const Tensor num = num_t.to(kCPU).contiguous().to(kInt32), idx = idx_t.to(kCPU).contiguous().to(kInt32);
  KILN_CHECK(num.dim() == 3 && idx.dim() == 4 && idx.size(0) == num.size(0) && idx.size(1) == num.size(1) &&
                 idx.size(2) == num.size(2),
             "BlockMask.from_kv_blocks", what, ": expected num_blocks [B, H, n] and indices [B, H, n, m], got ",
             shape_str(num.sizes()), " and ", shape_str(idx.sizes()));
  const int64_t rows = num.numel(), m = idx.size(3);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(rows));
  const int32_t* n = num.data_ptr<int32_t>();
  const int32_t* x = idx.data_ptr<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    KILN_CHECK(n[r] >= 0 && n[r] <= m, "BlockMask.from_kv_blocks", what, ": a row lists ", n[r],
               " blocks but indices hold ", m);
    out[r].assign(x + r * m, x + r * m + n[r]);
    std::sort(out[r].begin(), out[r].end());
  }
  return out;
}

}  // namespace

BlockMask detail::assemble(std::vector<std::vector<int32_t>> part, std::vector<std::vector<int32_t>> full, int64_t B,
                           int64_t H, int64_t q_len, int64_t kv_len, int64_t bs, MaskMod mask_mod) {
  BlockMask m;
  const int64_t nQ = ceil_div(q_len, bs), nKV = ceil_div(kv_len, bs);
  for (const auto* lists : {&part, &full})
    for (const auto& l : *lists)
      for (int32_t j : l)
        KILN_CHECK(j >= 0 && j < nKV, "BlockMask", "kv block index ", j, " out of range for ", nKV, " blocks");
  pack(part, B, H, nQ, m.kv_num_blocks, m.kv_indices);
  pack(full, B, H, nQ, m.full_kv_num_blocks, m.full_kv_indices);
  pack(transpose(part, B * H, nQ, nKV), B, H, nKV, m.q_num_blocks, m.q_indices);
  pack(transpose(full, B * H, nQ, nKV), B, H, nKV, m.full_q_num_blocks, m.full_q_indices);
  m.q_block_size = m.kv_block_size = bs;
  m.q_len = q_len;
  m.kv_len = kv_len;
  m.mask_mod = std::move(mask_mod);
  return m;
}

BlockMask detail::halve_blocks(const BlockMask& bm, const Program& prog) {
  const int64_t bs = bm.q_block_size / 2, B = bm.batch(), H = bm.heads();
  const int64_t nQ = ceil_div(bm.q_len, bm.q_block_size), nQ2 = ceil_div(bm.q_len, bs), nKV2 = ceil_div(bm.kv_len, bs);
  const auto part = unpack(bm.kv_num_blocks, bm.kv_indices, "kv_indices");
  const auto full = unpack(bm.full_kv_num_blocks, bm.full_kv_indices, "full_kv_indices");
  std::vector<std::vector<int32_t>> part2(static_cast<size_t>(B * H * nQ2)), full2(part2.size());
  std::vector<Interval> regs;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i2 = 0; i2 < nQ2; ++i2) {
      const size_t parent = static_cast<size_t>(bh * nQ + i2 / 2), row = static_cast<size_t>(bh * nQ2 + i2);
      const int64_t q0 = i2 * bs, q1 = std::min(bm.q_len, q0 + bs) - 1;
      for (int32_t j : full[parent])
        for (int32_t j2 = 2 * j; j2 < 2 * j + 2 && j2 < nKV2; ++j2) full2[row].push_back(j2);
      for (int32_t j : part[parent])
        for (int32_t j2 = 2 * j; j2 < 2 * j + 2 && j2 < nKV2; ++j2) {
          const int64_t k0 = int64_t{j2} * bs, k1 = std::min(bm.kv_len, k0 + bs) - 1;
          const Interval iv = eval_interval(prog, bh / H, bh % H, q0, q1, k0, k1, regs);
          if (iv.can_true) (iv.can_false ? part2 : full2)[row].push_back(j2);
        }
      std::sort(full2[row].begin(), full2[row].end());
    }
  return assemble(std::move(part2), std::move(full2), B, H, bm.q_len, bm.kv_len, bs, bm.mask_mod);
}

BlockMask detail::merge_block_lists(const BlockMask& bm) {
  // The rows of num_t [B, H, n] merged: 2 * block + 1 for a partial block, 2 * block for a full one.
  const auto merge = [](const Tensor& pn, const Tensor& pi, const Tensor& fn, const Tensor& fi, const char* what,
                        Tensor& num, Tensor& idx) {
    std::vector<std::vector<int32_t>> rows = unpack(pn, pi, what);
    const auto full = unpack(fn, fi, what);
    for (size_t r = 0; r < rows.size(); ++r) {
      for (int32_t& j : rows[r]) j = 2 * j + 1;
      for (int32_t j : full[r]) rows[r].push_back(2 * j);
      std::sort(rows[r].begin(), rows[r].end());
    }
    pack(rows, pn.size(0), pn.size(1), pn.size(2), num, idx);
  };
  BlockMask out = bm;
  merge(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, "kv lists", out.kv_num_blocks,
        out.kv_indices);
  merge(bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices, "q lists", out.q_num_blocks,
        out.q_indices);
  return out;
}

BlockMask create_block_mask(const MaskMod& mask_mod, int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN,
                            int64_t block_size, Device device) {
  const char* op = "create_block_mask";
  KILN_CHECK(B >= 1 && H >= 1 && Q_LEN >= 1 && KV_LEN >= 1, op, "B, H, Q_LEN, KV_LEN must be positive, got ", B,
             ", ", H, ", ", Q_LEN, ", ", KV_LEN);
  KILN_CHECK(block_size >= 1, op, "block_size must be positive, got ", block_size);
  const detail::Program prog = detail::compile(mask_mod.expr);
  for (const detail::Buffer& buf : prog.buffers) buf.build_pyramid();  // before threads share it
  detail::check_mask_loads(prog, mask_mod.expr, op, B, H, Q_LEN, KV_LEN);
  const int64_t nQ = ceil_div(Q_LEN, block_size), nKV = ceil_div(KV_LEN, block_size);
  // Only distinct (b, h) pairs are classified; the rest copy them.
  const int64_t Bc = mask_mod.expr.uses_b() ? B : 1, Hc = mask_mod.expr.uses_h() ? H : 1;
  const int64_t rows = Bc * Hc * nQ;
  std::vector<std::vector<int32_t>> part(static_cast<size_t>(rows)), full(static_cast<size_t>(rows));
  std::atomic<bool> index_error{false};
#pragma omp parallel if (rows >= 32)  // data-dependent rows cost ~50 us each (doc masks)
  {
    RowClassifier rc{prog, Q_LEN, KV_LEN, block_size, nKV, {}, nullptr};
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % nQ, bh = r / nQ;
      rc.b = bh / Hc;
      rc.h = bh % Hc;
      rc.q0 = i * block_size;
      rc.q1 = std::min(Q_LEN, rc.q0 + block_size) - 1;
      rc.part = &part[r];
      rc.full = &full[r];
      // schedule(dynamic, 16) hands out runs of consecutive rows: row r-1 of the same (b, h) is
      // this thread's previous row unless r starts a run.
      const bool has_prev = i > 0 && r % 16 != 0;
      rc.row(has_prev ? &part[r - 1] : nullptr);
    }
    if (rc.dense && rc.dense->index_error()) index_error = true;
  }
  KILN_CHECK(!index_error, op, "mask_mod reads a captured tensor out of range (check its length against Q_LEN ",
             Q_LEN, " and KV_LEN ", KV_LEN, ")");
  if (Bc != B || Hc != H) {
    std::vector<std::vector<int32_t>> p2(static_cast<size_t>(B * H * nQ)), f2(p2.size());
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t hi = 0; hi < H; ++hi)
        for (int64_t i = 0; i < nQ; ++i) {
          const int64_t src = ((Bc == 1 ? 0 : bi) * Hc + (Hc == 1 ? 0 : hi)) * nQ + i;
          p2[(bi * H + hi) * nQ + i] = part[src];
          f2[(bi * H + hi) * nQ + i] = full[src];
        }
    part.swap(p2);
    full.swap(f2);
  }
  BlockMask bm = detail::assemble(std::move(part), std::move(full), B, H, Q_LEN, KV_LEN, block_size, mask_mod);
  return device.is_cpu() ? bm : bm.to(device);  // built on the CPU (interval analysis), then moved once
}

BlockMask BlockMask::from_kv_blocks(const Tensor& kv_num_blocks, const Tensor& kv_indices,
                                    const Tensor& full_kv_num_blocks, const Tensor& full_kv_indices, int64_t q_len,
                                    int64_t kv_len, int64_t block_size, MaskMod mask_mod) {
  auto part = unpack(kv_num_blocks, kv_indices, "kv_indices");
  const int64_t B = kv_num_blocks.size(0), H = kv_num_blocks.size(1);
  KILN_CHECK(kv_num_blocks.size(2) == ceil_div(q_len, block_size), "BlockMask.from_kv_blocks", "kv_num_blocks has ",
             kv_num_blocks.size(2), " q blocks, expected ", ceil_div(q_len, block_size));
  std::vector<std::vector<int32_t>> full(part.size());
  if (full_kv_num_blocks.defined()) {
    full = unpack(full_kv_num_blocks, full_kv_indices, "full_kv_indices");
    KILN_CHECK(full.size() == part.size(), "BlockMask.from_kv_blocks", "full_kv_num_blocks shape ",
               shape_str(full_kv_num_blocks.sizes()), " differs from kv_num_blocks ", shape_str(kv_num_blocks.sizes()));
  }
  return detail::assemble(std::move(part), std::move(full), B, H, q_len, kv_len, block_size, std::move(mask_mod));
}

Shape BlockMask::shape() const { return {batch(), heads(), q_len, kv_len}; }

BlockMask BlockMask::to(Device device) const {
  BlockMask m = *this;
  for (Tensor* t : {&m.kv_num_blocks, &m.kv_indices, &m.full_kv_num_blocks, &m.full_kv_indices, &m.q_num_blocks,
                    &m.q_indices, &m.full_q_num_blocks, &m.full_q_indices})
    if (t->defined() && t->device() != device) *t = t->to(device);
  return m;
}

double BlockMask::sparsity() const {
  if (kv_num_blocks.is_cuda()) return to(kCPU).sparsity();
  const int64_t total = batch() * heads() * num_q_blocks() * num_kv_blocks();
  if (total == 0) return 0;
  int64_t computed = 0;
  const int32_t* a = kv_num_blocks.data_ptr<int32_t>();
  const int32_t* f = full_kv_num_blocks.data_ptr<int32_t>();
  for (int64_t r = 0; r < kv_num_blocks.numel(); ++r) computed += a[r] + f[r];
  return 100.0 * (1.0 - static_cast<double>(computed) / static_cast<double>(total));
}

Tensor BlockMask::to_dense() const {
  if (kv_num_blocks.is_cuda()) return to(kCPU).to_dense();  // on the CPU, like the other summaries
  const int64_t nQ = num_q_blocks(), nKV = num_kv_blocks();
  Tensor out = zeros({batch(), heads(), nQ, nKV}, kInt32);
  int32_t* o = out.data_ptr<int32_t>();
  for (const auto& [num_t, idx_t] : {std::pair{kv_num_blocks, kv_indices}, std::pair{full_kv_num_blocks, full_kv_indices}}) {
    const int32_t* n = num_t.data_ptr<int32_t>();
    const int32_t* x = idx_t.data_ptr<int32_t>();
    const int64_t m = idx_t.size(3);
    for (int64_t r = 0; r < num_t.numel(); ++r)
      for (int32_t c = 0; c < n[r]; ++c) o[r * nKV + x[r * m + c]] = 1;
  }
  return out;
}

int64_t BlockMask::nbytes() const {
  int64_t s = 0;
  for (const Tensor* t : {&kv_num_blocks, &kv_indices, &full_kv_num_blocks, &full_kv_indices, &q_num_blocks,
                          &q_indices, &full_q_num_blocks, &full_q_indices})
    s += static_cast<int64_t>(t->nbytes());
  return s;
}

std::string BlockMask::to_string() const {
  if (kv_num_blocks.is_cuda()) return to(kCPU).to_string();
  std::ostringstream os;
  os << "BlockMask(shape=" << shape_str(shape()) << ", block_size=" << q_block_size << ", sparsity=";
  os.setf(std::ios::fixed);
  os.precision(2);
  os << sparsity() << "%, mask_mod=" << mask_mod.to_string() << ")\n";
  const int64_t nQ = num_q_blocks(), nKV = num_kv_blocks(), show = 48;
  const int32_t *pn = kv_num_blocks.data_ptr<int32_t>(), *px = kv_indices.data_ptr<int32_t>();
  const int32_t *fn = full_kv_num_blocks.data_ptr<int32_t>(), *fx = full_kv_indices.data_ptr<int32_t>();
  const int64_t pm = kv_indices.size(3), fm = full_kv_indices.size(3);
  for (int64_t bh = 0; bh < std::min<int64_t>(batch() * heads(), 2); ++bh) {
    os << "(" << bh / heads() << ", " << bh % heads() << ")\n";
    for (int64_t i = 0; i < std::min(nQ, show); ++i) {
      std::string line(static_cast<size_t>(std::min(nKV, show)), '.');
      const int64_t r = bh * nQ + i;
      for (int32_t c = 0; c < pn[r]; ++c)
        if (px[r * pm + c] < show) line[px[r * pm + c]] = '+';
      for (int32_t c = 0; c < fn[r]; ++c)
        if (fx[r * fm + c] < show) line[fx[r * fm + c]] = '#';
      os << line << (nKV > show ? " ...\n" : "\n");
    }
    if (nQ > show) os << "...\n";
  }
  return os.str();
}

}  // namespace kiln::flex
