#pragma once
// The mod IR compiled to a flat program (one instruction per distinct tree node, operands before
// users), its row evaluator (one query row against a run of kv positions, every instruction a
// loop over small arrays: no per-element dispatch), the reverse pass that differentiates a
// score_mod row, and interval evaluation over index boxes (for BlockMask classification).
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/flex.h"

namespace kiln::flex {

struct CapturedTensor {
  Tensor tensor;  // as the user gave it (gradients flow to it)
  Kind kind = Kind::Int;
};

namespace detail {

struct Instr {
  Op op;
  Kind kind;
  int32_t a = -1, b = -1, c = -1;  // operand instructions
  int32_t nidx = 0;                // Load: number of indices (== the tensor's dim)
  int32_t buf = -1;                // Load: captured buffer
  int64_t ival = 0;
  double fval = 0;
  bool needs_adj = false;          // on a path from score or a grad-requiring load to the result
};

// A captured tensor prepared for reading: contiguous values as int64 / float / double.
struct Buffer {
  std::shared_ptr<CapturedTensor> src;
  Kind kind = Kind::Int;
  int ndim = 1;
  int64_t sizes[3] = {1, 1, 1};
  int64_t strides[3] = {0, 0, 0};
  int64_t numel = 0;
  std::vector<int64_t> ivals;  // Int / Bool
  std::vector<double> dvals;   // Float
  std::vector<float> fvals;    // Float
  bool needs_grad = false;     // float tensor that requires grad
  // Interval support: per-row min/max pyramids over the last dim (built on demand).
  mutable std::vector<double> pyr_min, pyr_max;
  mutable std::vector<int64_t> level_off;  // offsets of each level inside one row's pyramid
  mutable int64_t row_pyr = 0;
  void build_pyramid() const;
  // min / max over the box lo..hi (inclusive, already clamped) of indices.
  void range(const int64_t* lo, const int64_t* hi, double* mn, double* mx) const;
};

struct Program {
  std::vector<Instr> code;
  std::vector<Buffer> buffers;
  int32_t result = -1;
  bool reads_tensors = false;
  bool uses_score = false;
  bool any_grad = false;  // some buffer needs a gradient
  uint64_t id = 0;        // unique per compile() in this process (a cache key that is never reused)
};

// ToInt: toward zero, NaN -> 0, clamped to +-2^62 (the CUDA codegen's kiln_f2i does the same).
template <typename F>
inline int64_t float_to_int(F x) {
  constexpr F kLim = F(4611686018427387904.0);  // 2^62, exact in float and double
  if (!(x == x)) return 0;
  return static_cast<int64_t>(x < -kLim ? -kLim : x > kLim ? kLim : x);
}

// Compiles `e`; the tensors it reads are copied once (contiguous) into buffers.
Program compile(const Expr& e);

// Evaluates a program for one query row over kv positions kv0 .. kv0 + n - 1.
template <typename F>
class RowEval {
 public:
  RowEval(const Program& p, int64_t max_n);
  // score: n values (ignored unless the program reads score).
  void run(int64_t b, int64_t h, int64_t q, int64_t kv0, int64_t n, const F* score);
  const F* float_result() const { return fregs_.data() + off_[prog_->result] ; }
  const uint8_t* bool_result() const { return bregs_.data() + off_[prog_->result]; }
  // After run(): given d(result) over the n positions, writes d(score) and adds the gradients of
  // captured tensors into grads[buffer] (double, in position order: deterministic).
  void backward(const F* dresult, F* dscore, std::vector<std::vector<double>>& grads);
  bool index_error() const { return index_error_; }
  // The first out-of-range read since construction: buffer, index dim, the index and its kv.
  struct IndexFault {
    int32_t buf = -1;
    int dim = 0;
    int64_t index = 0, kv = 0;
  };
  const IndexFault& index_fault() const { return fault_; }

 private:
  const Program* prog_;
  int64_t max_n_;
  int64_t n_ = 0;
  std::vector<int64_t> off_;  // per instruction: offset into its typed register file
  std::vector<int64_t> iregs_;
  std::vector<F> fregs_;
  std::vector<uint8_t> bregs_;
  std::vector<F> adj_;
  bool index_error_ = false;
  IndexFault fault_;
};

// Interval value of one instruction: ints in [ilo, ihi], floats in [flo, fhi] (nan: may be NaN),
// bools by which values are possible.
struct Interval {
  int64_t ilo = 0, ihi = 0;
  double flo = 0, fhi = 0;
  bool nan = false;
  bool can_false = false, can_true = false;
};

// Evaluates the program for b, h fixed and q in [q0, q1], kv in [k0, k1] (inclusive);
// regs is scratch (resized as needed). Returns the result's interval.
Interval eval_interval(const Program& p, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                       std::vector<Interval>& regs);

// The index bounds under which the CUDA codegen may keep int locals in 32 bits and convert small
// ones to float by a magic number: 0 <= q, kv < 2^22, 0 <= b, h < 2^16 (the host falls back to
// 64-bit locals past them).
constexpr int64_t kNarrowQKv = int64_t{1} << 22;
constexpr int64_t kNarrowBH = int64_t{1} << 16;

// Per instruction: an int whose every value fits int32 (INT32_MIN excluded) for any b, h, q, kv
// within the narrow bounds and any captured-tensor values (loads count as unbounded).
std::vector<bool> int32_instructions(const Program& p);

// Per instruction: an int whose every value lies in [-2^22, 2^22] under the narrow bounds, which
// the CUDA codegen converts to float exactly with an integer and a float add (kiln_i2f).
std::vector<bool> small_int_instructions(const Program& p);

// True when d(result)/d(score) is 1 wherever the program is differentiated and no captured tensor
// needs a gradient: the result is score plus or minus terms free of it (ALiBi, a fixed bias), so
// the CUDA backward may take dS as the gradient of the modified score (its split P).
bool score_grad_is_one(const Program& p);

// True when interval analysis proves every tensor load of the program in range for all b < B,
// h < H, q < L, kv < S (so a kernel need not report out-of-range indices back to the host).
bool loads_in_bounds(const Program& p, int64_t B, int64_t H, int64_t L, int64_t S);

// The number n of `t` in to_string(e), which prints it as bufn (-1 when e does not read it).
int captured_number(const Expr& e, const CapturedTensor* t);

// Raises a kiln::Error from `op` when some load of the mask program `p` (compiled from `e`)
// reads outside its tensor at some b < B, h < H, q < L, kv < S: the row evaluator reads every
// load at every position, so such a read is an error whether or not the blocks it falls in are
// ever evaluated. Interval analysis proves most masks in range at once; boxes it cannot decide
// are split, and small ones evaluated exactly (bounds.cpp).
void check_mask_loads(const Program& p, const Expr& e, const char* op, int64_t B, int64_t H, int64_t L, int64_t S);

}  // namespace detail
}  // namespace kiln::flex
