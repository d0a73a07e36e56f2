#pragma once
// FlexAttention: attention whose scores and mask are changed by small user expressions
// (score_mod, mask_mod), run block-sparse through a BlockMask (PyTorch's names and semantics).
//
// ---- The mod IR ----
// A mod is an expression tree (kiln::flex::Expr) built with C++ operators. Leaves:
//   score                      the raw score q·k * scale (float; score_mod only)
//   b, h, q_idx, kv_idx        batch, query head, query position, key position (int64)
//   constants                  Expr(3) is int64, Expr(0.5) is float, Expr(true) is bool
//   t[i], t[i][j], t[i][j][k]  loads from a captured tensor (Captured t = capture(tensor)), 1-D
//                              to 3-D; integer tensors load int64, float tensors load float,
//                              bool tensors load bool. Indices are int expressions.
// Ops: + - * (int or float; mixing promotes to float), / (float division; int / int is FLOOR
// division like Python's //), % (floor modulo like Python's and torch.remainder: ints, or floats as
// x - floor(x / y) * y), unary -, comparisons (< <= > >= == !=) giving bool, & | ! on bools,
// where(c, x, y), min, max, clamp, abs, sign, tanh, sigmoid, exp, log, floor, to_int (float -> int,
// toward zero like torch's .long(); NaN gives 0).
// Gradients (score_mod): min / max / clamp send a tie to their first operand; sign, floor and the
// int conversions have zero gradient, as in torch.
// Kinds are checked when the tree is built (kiln::Error "[flex] ..." on a misuse).
// Floats evaluate in the attention's compute type (fp32 for f32/bf16/f16, fp64 for f64).
// A load outside the captured tensor raises "[flex_attention] captured tensor index ... out of
// range" after the kernel (the read itself is clamped, never out of bounds).
//
// Mods are plain values: MaskMod wraps a bool expression of (b, h, q_idx, kv_idx); ScoreMod a
// float expression of (score, b, h, q_idx, kv_idx). Both can be made from a lambda:
//   MaskMod causal([](Expr b, Expr h, Expr q, Expr kv) { return q >= kv; });
//   Captured bias = capture(rel_bias);  // [H, 2L-1], requires_grad
//   ScoreMod rel([&](Expr s, Expr b, Expr h, Expr q, Expr kv) { return s + bias[h][q - kv + L - 1]; });
// Gradients flow from the attention output into captured float tensors that require grad.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::flex {

enum class Kind : uint8_t { Int, Float, Bool };

enum class Op : uint8_t {
  Score, B, H, QIdx, KvIdx, ConstInt, ConstFloat, ConstBool, Load, ToFloat,
  Add, Sub, Mul, Div, Mod, Neg, Lt, Le, Gt, Ge, Eq, Ne, And, Or, Not, Where, Min, Max, Abs,
  Tanh, Exp, Log, Sign, Sigmoid, Floor, ToInt
};

struct CapturedTensor;  // a tensor a mod reads (shared by every Expr that loads from it)

struct ExprNode {
  Op op = Op::ConstInt;
  Kind kind = Kind::Int;
  int64_t ival = 0;  // ConstInt / ConstBool
  double fval = 0;   // ConstFloat
  std::vector<std::shared_ptr<const ExprNode>> args;
  std::shared_ptr<CapturedTensor> tensor;  // Load: args are the indices given so far
};

class Expr {
 public:
  Expr();                   // int 0
  Expr(int v);              // NOLINT: int constant
  Expr(int64_t v);          // NOLINT
  Expr(double v);           // NOLINT: float constant
  Expr(bool v);             // NOLINT: bool constant
  explicit Expr(std::shared_ptr<const ExprNode> node) : node_(std::move(node)) {}

  Kind kind() const { return node_->kind; }
  const std::shared_ptr<const ExprNode>& node() const { return node_; }
  // Indexes a captured-tensor load one more dimension: t[h][q_idx - kv_idx].
  Expr operator[](const Expr& index) const;
  // True when the expression reads a captured tensor (its value depends on data).
  bool reads_tensors() const;
  // Uses b / h (so a BlockMask must be built per batch / head).
  bool uses_b() const;
  bool uses_h() const;

 private:
  std::shared_ptr<const ExprNode> node_;
};

// The leaves.
Expr score();
Expr b();
Expr h();
Expr q_idx();
Expr kv_idx();

class Captured {
 public:
  Captured() = default;
  explicit Captured(const Tensor& t);
  Expr operator[](const Expr& index) const;
  const Tensor& tensor() const;

 private:
  std::shared_ptr<CapturedTensor> data_;
};
// Captures `t` (CPU, 1-D to 3-D) by reference: gradients flow back to it. flex_attention reads
// its values again when its version() moved (every in-place kiln op bumps it); memory written
// behind kiln's back (through data_ptr, a from_blob source) needs t.bump_version() first.
Captured capture(const Tensor& t);

Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator*(const Expr& a, const Expr& b);
Expr operator/(const Expr& a, const Expr& b);
Expr operator%(const Expr& a, const Expr& b);
Expr operator-(const Expr& a);
Expr operator<(const Expr& a, const Expr& b);
Expr operator<=(const Expr& a, const Expr& b);
Expr operator>(const Expr& a, const Expr& b);
Expr operator>=(const Expr& a, const Expr& b);
Expr operator==(const Expr& a, const Expr& b);
Expr operator!=(const Expr& a, const Expr& b);
Expr operator&(const Expr& a, const Expr& b);
Expr operator|(const Expr& a, const Expr& b);
Expr operator!(const Expr& a);
Expr where(const Expr& cond, const Expr& x, const Expr& y);
Expr min(const Expr& a, const Expr& b);
Expr max(const Expr& a, const Expr& b);
Expr abs(const Expr& a);
Expr tanh(const Expr& a);
Expr exp(const Expr& a);
Expr log(const Expr& a);
Expr sign(const Expr& a);       // int -> int, float -> float (-1, 0, 1)
Expr sigmoid(const Expr& a);    // 1 / (1 + exp(-a))
Expr floor(const Expr& a);      // float -> float; identity on ints
Expr to_int(const Expr& a);     // float -> int toward zero (NaN -> 0, clamped to +-2^62); bool -> 0/1
Expr to_float(const Expr& a);   // int or bool -> float
Expr clamp(const Expr& a, const Expr& lo, const Expr& hi);  // min(max(a, lo), hi), torch.clamp
Expr remainder(const Expr& a, const Expr& b);               // a % b

// Printable, fully parenthesised C-like form; captured tensors print as buf0, buf1, ... in order
// of first appearance, e.g. "((q_idx >= kv_idx) & ((q_idx - kv_idx) < 256))".
std::string to_string(const Expr& e);
// The tensors `e` loads from, each once, in order of first appearance (the same handles the mod
// holds: e.g. the Python adapters route gradients of captured torch tensors through them).
std::vector<Tensor> captured_tensors(const Expr& e);

// mask_mod(b, h, q_idx, kv_idx) -> bool. Default: noop (everything attends).
struct MaskMod {
  Expr expr;
  MaskMod();
  explicit MaskMod(Expr e);
  template <typename F, typename = std::enable_if_t<std::is_invocable_r_v<Expr, F, Expr, Expr, Expr, Expr>>>
  MaskMod(F f) : MaskMod(f(b(), h(), q_idx(), kv_idx())) {}  // NOLINT
  std::string to_string() const { return flex::to_string(expr); }
};

// score_mod(score, b, h, q_idx, kv_idx) -> float. Default: identity.
struct ScoreMod {
  Expr expr;
  ScoreMod();
  explicit ScoreMod(Expr e);
  template <typename F,
            typename = std::enable_if_t<std::is_invocable_r_v<Expr, F, Expr, Expr, Expr, Expr, Expr>>>
  ScoreMod(F f) : ScoreMod(f(score(), b(), h(), q_idx(), kv_idx())) {}  // NOLINT
  bool is_identity() const;
  std::string to_string() const { return flex::to_string(expr); }
};

MaskMod noop_mask();
MaskMod and_masks(const std::vector<MaskMod>& masks);
MaskMod or_masks(const std::vector<MaskMod>& masks);

// ---- Built-in mods ----
MaskMod causal_mask();                       // q_idx >= kv_idx
MaskMod sliding_window_mask(int64_t window); // causal, q_idx - kv_idx < window
MaskMod document_mask(const Tensor& doc_ids);  // doc_ids: [L] int -> doc[q_idx] == doc[kv_idx]
MaskMod prefix_lm_mask(int64_t prefix);      // kv_idx < prefix | q_idx >= kv_idx
MaskMod chunked_mask(int64_t chunk);         // q_idx / chunk == kv_idx / chunk (local blocks)
ScoreMod alibi(const Tensor& slopes);        // slopes: [H] -> score + slopes[h] * (kv_idx - q_idx)
ScoreMod softcap(double cap);                // cap * tanh(score / cap)
// bias: [H, n] float, learned: score + bias[h][q_idx - kv_idx + offset]; grads flow into bias.
ScoreMod relative_position_bias(const Tensor& bias, int64_t offset);

// ---- BlockMask ----
// Per (b, h, q-block) the kv blocks that need computing, split into partial blocks (mask_mod is
// applied) and full blocks (mask_mod skipped); the q_* set is the transpose (per kv block, its
// q blocks) for the backward. All int32. Index lists are sorted ascending and padded: the last
// dim is the largest count anywhere (not the number of blocks as in PyTorch), so long sparse
// masks stay small; only the first *_num_blocks entries of a row are meaningful.
//   kv_num_blocks [B, H, nQ], kv_indices [B, H, nQ, maxKV], full_kv_* likewise
//   q_num_blocks [B, H, nKV], q_indices [B, H, nKV, maxQ], full_q_* likewise
// B or H of 1 broadcasts over the attention's batch / heads.
class BlockMask {
 public:
  Tensor kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
  Tensor q_num_blocks, q_indices, full_q_num_blocks, full_q_indices;
  int64_t q_block_size = 128, kv_block_size = 128;
  int64_t q_len = 0, kv_len = 0;
  MaskMod mask_mod;

  // PyTorch's BlockMask.from_kv_blocks: builds the transposed q_* set. full_* may be undefined.
  static BlockMask from_kv_blocks(const Tensor& kv_num_blocks, const Tensor& kv_indices,
                                  const Tensor& full_kv_num_blocks, const Tensor& full_kv_indices,
                                  int64_t q_len, int64_t kv_len, int64_t block_size = 128,
                                  MaskMod mask_mod = MaskMod());

  Shape shape() const;          // [B, H, q_len, kv_len]
  int64_t batch() const { return kv_num_blocks.size(0); }
  int64_t heads() const { return kv_num_blocks.size(1); }
  int64_t num_q_blocks() const { return kv_num_blocks.size(2); }
  int64_t num_kv_blocks() const { return q_num_blocks.size(2); }
  double sparsity() const;      // percent of blocks not computed (neither partial nor full)
  Tensor to_dense() const;      // [B, H, nQ, nKV] int32: 1 where the block is computed
  std::string to_string() const;  // summary + block map ('#' full, '+' partial, '.' empty)
  int64_t nbytes() const;       // bytes held by the eight tensors
  BlockMask to(Device device) const;  // the eight tensors copied to `device` (summaries read the CPU)
};

// Classifies every (q-block, kv-block) as empty / partial / full by interval analysis of the mask
// IR (row by row, splitting kv ranges in halves, so the cost follows the mask's boundaries, not
// L×S); blocks the analysis cannot decide and whose mask reads tensors are evaluated densely.
// B, H: 1 to broadcast. Built on the CPU; `device` (e.g. "cuda") moves the tensors there once, so
// flex_attention on that device uses them directly (a CPU mask is moved per call, through a small
// cache keyed by its tensors).
BlockMask create_block_mask(const MaskMod& mask_mod, int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN,
                            int64_t block_size = 128, Device device = kCPU);

// ---- flex_attention ----
struct FlexOptions {
  ScoreMod score_mod;          // identity by default
  const BlockMask* block_mask = nullptr;  // none: every block is computed (dense); read during
                                          // the call only (autograd keeps its own copy)
  double scale = 0;            // 0: 1/sqrt(E)
  bool enable_gqa = false;     // Hq a multiple of Hkv
  bool return_lse = false;
};

struct FlexOutput {
  Tensor out;  // [B, Hq, L, Ev], q's dtype
  Tensor lse;  // [B, Hq, L] natural-log logsumexp (fp32; fp64 for fp64 q); only with return_lse
  operator const Tensor&() const { return out; }  // NOLINT: Tensor o = flex_attention(...)
};

// q: [B, Hq, L, E], k: [B, Hkv, S, E], v: [B, Hkv, S, Ev] (f32, f64, bf16, f16; one dtype)
// -> out [B, Hq, L, Ev] (+ lse [B, Hq, L]). Rows with nothing to attend give 0 and lse -inf.
// Differentiable in q, k, v, lse and the captured float tensors of score_mod; the CPU backward is
// bitwise deterministic for any thread count.
FlexOutput flex_attention(const Tensor& q, const Tensor& k, const Tensor& v, const FlexOptions& options = {});

}  // namespace kiln::flex
