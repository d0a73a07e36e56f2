// CUDA code generation for the mod IR: each program instruction becomes one typed local
// (long long for ints, or int where interval analysis proves it fits under the narrow index bounds
// and the host allows it; float for floats, bool for bools) in a straight-line device function, so
// nvcc's optimiser sees the whole expression; captured-tensor loads clamp their indices and
// raise the error flag like the CPU's RowEval. score_grad is RowEval::backward written out: the
// forward again, then one adjoint local per float instruction that needs one, in reverse order;
// loads of grad-requiring tensors add into a per-warp double slot when the caller passes one.
// Divisions by constants become multiplications by the reciprocal and tanh the SFU's tanh.approx
// (the kernels store bf16 / fp16, far coarser than either's error).
#include "flex/cuda/codegen.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace kiln::flex::cuda {
namespace {

using detail::Instr;
using detail::Program;

// A register name ("v3", "a7"); built by appending (GCC 12 warns falsely on "v" + to_string).
std::string reg(char prefix, int64_t k) {
  std::string s(1, prefix);
  s += std::to_string(k);
  return s;
}

const char* ctype(Kind k) { return k == Kind::Int ? "long long" : k == Kind::Float ? "float" : "bool"; }

// An instruction's locals and their types: narrow[k] makes int instruction k an `int`, small[k]
// (within +-2^22) lets its conversion to float be kiln_i2f.
// fast: KernelConfig::fast_mods (narrow ints, kiln_i2f, reciprocal multiplies, tanh.approx).
struct Locals {
  const Program& p;
  bool fast;
  std::vector<bool> narrow, small;
  Locals(const Program& prog, bool fast_mods)
      : p(prog),
        fast(fast_mods),
        narrow(fast_mods ? detail::int32_instructions(prog) : std::vector<bool>(prog.code.size())),
        small(fast_mods ? detail::small_int_instructions(prog) : std::vector<bool>(prog.code.size())) {}
  const char* type(size_t k) const { return narrow[k] ? "int" : ctype(p.code[k].kind); }
};

std::string int_literal(int64_t v) {
  if (v == INT64_MIN) return "(-9223372036854775807LL - 1LL)";
  std::string s(1, '(');
  s += std::to_string(v);
  s += "LL)";
  return s;
}

std::string float_literal(double v) {
  const float f = static_cast<float>(v);  // the CPU evaluates constants as static_cast<F>(fval)
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "__uint_as_float(0x%08xu)", bits);
  return buf;
}

// " * <1/c>" for a float division by constant instruction `o` whose reciprocal is a normal float
// (then x * (1/c) is within an ulp or so of x / c, with the same infinities, zeros and NaNs), else
// " / v<o>". An IEEE division is ~10 instructions and a slow-path branch that also blocks CSE.
std::string div_by(const Locals& lc, int32_t o) {
  const Program& p = lc.p;
  const Instr& in = p.code[o];
  if (lc.fast && in.op == Op::ConstFloat) {
    const double r = 1.0 / static_cast<double>(static_cast<float>(in.fval));
    if (std::isnormal(static_cast<float>(r))) return " * " + float_literal(r);
  }
  return " / " + reg('v', o);
}

const char* cmp_symbol(Op op) {
  switch (op) {
    case Op::Lt: return "<";
    case Op::Le: return "<=";
    case Op::Gt: return ">";
    case Op::Ge: return ">=";
    case Op::Eq: return "==";
    default: return "!=";
  }
}

// Emits the forward statements of `p`; `bp` is the buffer field prefix ("s" or "m").
void emit_forward(const Locals& lc, const char* bp, std::ostream& os) {
  const Program& p = lc.p;
  for (size_t k = 0; k < p.code.size(); ++k) {
    const Instr& in = p.code[k];
    const std::string v = reg('v', k);
    const bool is_int = in.kind == Kind::Int;
    // Int arithmetic runs in 64 bits unless the result and every operand are narrow: an int
    // operand is widened first (else int * int could wrap, or kiln_floordiv's overloads clash).
    auto wide_int = [&](int32_t o) { return o >= 0 && p.code[o].kind == Kind::Int && !lc.narrow[o]; };
    const bool wide = is_int && (!lc.narrow[k] || wide_int(in.a) || wide_int(in.b) || wide_int(in.c));
    auto operand = [&](int32_t o) { return (wide && lc.narrow[o] ? "(long long)" : "") + reg('v', o); };
    auto A = [&] { return operand(in.a); };
    auto B = [&] { return operand(in.b); };
    auto C = [&] { return operand(in.c); };
    if (in.op == Op::Load) {
      // The clamped flat index is its own local (f<k>), reused by score_grad's reverse pass.
      // Clamped with selects; the error flag's store only under KILN_INDEX_CHECK (loads the host
      // could not prove in range): a store between loads keeps nvcc from sharing the loads of
      // one tile's elements (a document mask reads doc[q] once per row, not per element).
      const int32_t idx[3] = {in.a, in.b, in.c};
      // KILN_INDEX32: the host proved every index in range and every flat offset below 2^31, so
      // no clamp and 32-bit products (a 64-bit clamp and multiply cost ~20 instructions a load;
      // the document mask's partial tiles ran ~7x a full tile's softmax).
      os << "#if KILN_INDEX32\n  const long long f" << k << " = (long long)(0";
      for (int d = 0; d < in.nidx; ++d)
        os << " + (int)v" << idx[d] << " * (int)P." << bp << "stride[" << in.buf << "][" << d << "]";
      os << ");\n#else\n";
      os << "  long long f" << k << " = 0;\n  {\n    bool bad = false;\n    long long x;\n";
      for (int d = 0; d < in.nidx; ++d) {
        const std::string sz = std::string("P.") + bp + "size[" + std::to_string(in.buf) + "][" + std::to_string(d) + "]";
        const std::string st = std::string("P.") + bp + "stride[" + std::to_string(in.buf) + "][" + std::to_string(d) + "]";
        os << "    x = v" << idx[d] << ";\n    bad |= x < 0 || x >= " << sz << ";\n    x = x < 0 ? 0 : (x >= " << sz
           << " ? " << sz << " - 1 : x);\n    f" << k << " += x * " << st << ";\n";
      }
      os << "#if KILN_INDEX_CHECK\n    if (bad) *P.err = 1;\n#endif\n    (void)bad;\n  }\n#endif\n";
      const std::string ptr = std::string("P.") + bp + "ptr[" + std::to_string(in.buf) + "]";
      os << "  const " << lc.type(k) << " " << v << " = ";
      if (in.kind == Kind::Float) os << "((const float*)" << ptr << ")[f" << k << "];\n";
      else if (in.kind == Kind::Int) os << "((const long long*)" << ptr << ")[f" << k << "];\n";
      else os << "(((const long long*)" << ptr << ")[f" << k << "] != 0);\n";
      continue;
    }
    os << "  const " << lc.type(k) << " " << v << " = ";
    const char* narrowing = lc.narrow[k] ? "(int)" : "";
    switch (in.op) {
      case Op::Score: os << "score"; break;
      case Op::B: os << narrowing << "b"; break;
      case Op::H: os << narrowing << "h"; break;
      case Op::QIdx: os << narrowing << "q"; break;
      case Op::KvIdx: os << narrowing << "kv"; break;
      case Op::ConstInt:
        if (lc.narrow[k]) os << in.ival;
        else os << int_literal(in.ival);
        break;
      case Op::ConstBool: os << (in.ival ? "true" : "false"); break;
      case Op::ConstFloat: os << float_literal(in.fval); break;
      case Op::ToFloat:
        if (lc.narrow[in.a] && lc.small[in.a]) os << "kiln_i2f(" << A() << ")";
        else os << "(float)" << A();
        break;
      case Op::Load: break;  // handled above
      case Op::Add: os << A() << " + " << B(); break;
      case Op::Sub: os << A() << " - " << B(); break;
      case Op::Mul: os << A() << " * " << B(); break;
      case Op::Div:
        if (is_int) os << "kiln_floordiv(" << A() << ", " << B() << ")";
        else os << A() << div_by(lc, in.b);
        break;
      case Op::Mod: os << "kiln_floormod(" << A() << ", " << B() << ")"; break;
      case Op::Neg: os << "-" << A(); break;
      case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Eq: case Op::Ne:
        os << "(" << A() << " " << cmp_symbol(in.op) << " " << B() << ")";
        break;
      case Op::And: os << "(" << A() << " && " << B() << ")"; break;
      case Op::Or: os << "(" << A() << " || " << B() << ")"; break;
      case Op::Not: os << "!" << A(); break;
      case Op::Where: os << "(" << A() << " ? " << B() << " : " << C() << ")"; break;
      case Op::Min:  // the CPU's exact selection (NaN and tie behaviour)
        if (is_int) os << "(" << A() << " < " << B() << " ? " << A() << " : " << B() << ")";
        else os << "(" << B() << " < " << A() << " ? " << B() << " : " << A() << ")";
        break;
      case Op::Max:
        if (is_int) os << "(" << A() << " > " << B() << " ? " << A() << " : " << B() << ")";
        else os << "(" << B() << " > " << A() << " ? " << B() << " : " << A() << ")";
        break;
      case Op::Abs:
        if (is_int) os << "(" << A() << " < 0 ? -" << A() << " : " << A() << ")";
        else os << "fabsf(" << A() << ")";
        break;
      case Op::Tanh: os << (lc.fast ? "kiln_tanh(" : "tanhf(") << A() << ")"; break;
      case Op::Exp: os << "expf(" << A() << ")"; break;
      case Op::Log: os << "logf(" << A() << ")"; break;
      case Op::Sign:  // RowEval's selection (NaN and -0 kept)
        if (is_int) os << "((" << A() << " > 0) - (" << A() << " < 0))";
        else os << "(" << A() << " > 0.f ? 1.f : (" << A() << " < 0.f ? -1.f : " << A() << "))";
        break;
      case Op::Sigmoid: os << "(1.f / (1.f + expf(-" << A() << ")))"; break;
      case Op::Floor: os << "floorf(" << A() << ")"; break;
      case Op::ToInt: os << "kiln_f2i(" << A() << ")"; break;
    }
    os << ";\n";
  }
}

void check_program(const Program& p, const char* what) {
  KILN_CHECK(p.buffers.size() <= static_cast<size_t>(kMaxBuffers), "flex_attention", "the ", what, " reads ",
             p.buffers.size(), " captured tensors; CUDA supports at most ", kMaxBuffers);
}

void emit_mask(const Program* mask, bool fast_mods, std::ostream& os) {
  os << "__device__ __forceinline__ bool mask_mod(long long b, long long h, long long q, long long kv, "
        "const FlexParams& P) {\n";
  if (!mask) {
    os << "  return true;\n}\n\n";
    return;
  }
  emit_forward(Locals(*mask, fast_mods), "m", os);
  os << "  return v" << mask->result << ";\n";
  os << "}\n\n";
}

void emit_score(const Program* score, bool fast_mods, std::ostream& os) {
  os << "__device__ __forceinline__ float score_mod(float score, long long b, long long h, long long q, long long kv, "
        "const FlexParams& P) {\n";
  if (!score) {
    os << "  return score;\n}\n\n";
  } else {
    emit_forward(Locals(*score, fast_mods), "s", os);
    os << "  return v" << score->result << ";\n";
    os << "}\n\n";
  }
  // d(result)/d(score) * g; adds captured-tensor gradients into slot when slot is not null.
  os << "__device__ __forceinline__ float score_grad(float score, long long b, long long h, long long q, long long kv, "
        "float g, const FlexParams& P, double* slot) {\n";
  if (!score) {
    os << "  return g;\n}\n\n";
    return;
  }
  const Program& p = *score;
  const Locals lc(p, fast_mods);
  emit_forward(lc, "s", os);
  os << "  float dscore = 0.f;\n";
  for (size_t k = 0; k < p.code.size(); ++k)
    if (p.code[k].needs_adj) os << "  float a" << k << " = 0.f;\n";
  if (p.code[p.result].needs_adj) {
    os << "  a" << p.result << " = g;\n";
    for (size_t k = p.code.size(); k-- > 0;) {
      const Instr& in = p.code[k];
      if (!in.needs_adj) continue;
      const std::string g = reg('a', k), y = reg('v', k);
      auto has = [&](int32_t o) { return o >= 0 && p.code[o].needs_adj; };
      auto adj = [](int32_t o) { return reg('a', o); };
      auto val = [](int32_t o) { return reg('v', o); };
      switch (in.op) {
        case Op::Score: os << "  dscore += " << g << ";\n"; break;
        case Op::Load:
          if (p.buffers[in.buf].needs_grad)
            os << "  if (slot) slot[P.sgoff[" << in.buf << "] + f" << k << "] += (double)" << g << ";\n";
          break;
        case Op::Add:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << ";\n";
          if (has(in.b)) os << "  " << adj(in.b) << " += " << g << ";\n";
          break;
        case Op::Sub:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << ";\n";
          if (has(in.b)) os << "  " << adj(in.b) << " -= " << g << ";\n";
          break;
        case Op::Mul:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << " * " << val(in.b) << ";\n";
          if (has(in.b)) os << "  " << adj(in.b) << " += " << g << " * " << val(in.a) << ";\n";
          break;
        case Op::Div:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << div_by(lc, in.b) << ";\n";
          if (has(in.b)) os << "  " << adj(in.b) << " -= " << g << " * " << y << div_by(lc, in.b) << ";\n";
          break;
        case Op::Neg:
          if (has(in.a)) os << "  " << adj(in.a) << " -= " << g << ";\n";
          break;
        case Op::Where:
          if (has(in.b)) os << "  " << adj(in.b) << " += " << val(in.a) << " ? " << g << " : 0.f;\n";
          if (has(in.c)) os << "  " << adj(in.c) << " += " << val(in.a) << " ? 0.f : " << g << ";\n";
          break;
        case Op::Min:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << val(in.b) << " < " << val(in.a) << " ? 0.f : " << g << ";\n";
          if (has(in.b)) os << "  " << adj(in.b) << " += " << val(in.b) << " < " << val(in.a) << " ? " << g << " : 0.f;\n";
          break;
        case Op::Max:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << val(in.b) << " > " << val(in.a) << " ? 0.f : " << g << ";\n";
          if (has(in.b)) os << "  " << adj(in.b) << " += " << val(in.b) << " > " << val(in.a) << " ? " << g << " : 0.f;\n";
          break;
        case Op::Abs:
          if (has(in.a))
            os << "  " << adj(in.a) << " += " << val(in.a) << " > 0.f ? " << g << " : " << val(in.a) << " < 0.f ? -" << g
               << " : 0.f;\n";
          break;
        case Op::Tanh:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << " * (1.f - " << y << " * " << y << ");\n";
          break;
        case Op::Exp:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << " * " << y << ";\n";
          break;
        case Op::Log:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << " / " << val(in.a) << ";\n";
          break;
        case Op::Sigmoid:
          if (has(in.a)) os << "  " << adj(in.a) << " += " << g << " * " << y << " * (1.f - " << y << ");\n";
          break;
        default: break;  // sign, floor: flat
      }
    }
  }
  os << "  return dscore;\n";
  os << "}\n\n";
}

}  // namespace

std::string generate_mod_functions(const detail::Program* score, const detail::Program* mask, bool fast_mods) {
  if (score) check_program(*score, "score_mod");
  if (mask) check_program(*mask, "mask_mod");
  std::ostringstream os;
  emit_mask(mask, fast_mods, os);
  emit_score(score, fast_mods, os);
  return os.str();
}

std::string mask_range_functions(const detail::Program& mask, bool fast_mods) {
  std::ostringstream fwd, os;
  emit_forward(Locals(mask, fast_mods), "m", fwd);
  if (!emit_mask_range(mask, Op::KvIdx, "mask_kv_range", fwd.str(), os) ||
      !emit_mask_range(mask, Op::QIdx, "mask_q_range", fwd.str(), os))
    return "";
  return os.str();
}

std::string generate_mod_check_source(const detail::Program* score, const detail::Program* mask, bool fast_mods) {
  std::ostringstream os;
  os << "#define KILN_PARAMS_SIZE " << sizeof(FlexParams) << "\n";
  os << "#define KILN_INDEX_CHECK 1\n";
  os << "#include \"flex/cuda/device_common.cuh\"\n";
  os << generate_mod_functions(score, mask, fast_mods);
  os << "extern \"C\" __global__ void flex_mod_check(const FlexParams P, float* out, double* slot) {\n"
        "  const long long q = threadIdx.x, kv = blockIdx.x;\n"
        "  const float s = score_mod(0.25f * (float)(q - kv), 0, 1, q, kv, P);\n"
        "  out[q * gridDim.x + kv] = mask_mod(0, 1, q, kv, P) ? score_grad(s, 0, 1, q, kv, 1.f, P, slot) : 0.f;\n"
        "}\n";
  return os.str();
}

std::string generate_source(const detail::Program* score, const detail::Program* mask, const KernelConfig& cfg) {
  KILN_CHECK(cfg.head_dim == 64 || cfg.head_dim == 128, "flex_attention", "CUDA head dim must be 64 or 128, got ",
             cfg.head_dim);
  KILN_CHECK(cfg.fwd_tile_m > 0 && cfg.fwd_tile_m % 16 == 0 && cfg.fwd_threads() <= 512 && cfg.fwd_tile_n > 0 &&
                 cfg.fwd_tile_n % 16 == 0,
             "flex_attention", "bad forward tile ", cfg.fwd_tile_m, " x ", cfg.fwd_tile_n);
  KILN_CHECK(!cfg.wgmma || ((cfg.fwd_tile_m == 64 || cfg.fwd_tile_m == 128) && (cfg.fwd_tile_n == 64 || cfg.fwd_tile_n == 128)),
             "flex_attention", "the wgmma forward takes 64- or 128-row tiles of 64 or 128 columns, got ",
             cfg.fwd_tile_m, " x ", cfg.fwd_tile_n);
  std::ostringstream os;
  os << "// kiln FlexAttention kernels (generated; compiled at run time by NVRTC)\n";
  os << "#define KILN_BF16 " << (cfg.bf16 ? 1 : 0) << "\n";
  os << "#define HEAD_DIM " << cfg.head_dim << "\n";
  os << "#define TILE_M " << kTileM << "\n";
  os << "#define TILE_N " << kTileN << "\n";
  os << "#define FWD_TILE_M " << cfg.fwd_tile_m << "\n";
  os << "#define FWD_TILE_N " << cfg.fwd_tile_n << "\n";
  os << "#define FWD_WGMMA " << (cfg.wgmma ? 1 : 0) << "\n";
  os << "#define BWD_WGMMA " << (cfg.wgmma ? 1 : 0) << "\n";
  os << "#define KILN_INDEX_CHECK " << (cfg.index_check ? 1 : 0) << "\n";
  os << "#define KILN_INDEX32 " << (cfg.index32 && !cfg.index_check ? 1 : 0) << "\n";
  if (cfg.wgmma) os << "#define FWD_TMA 1\n";
  if (cfg.fwd_persist && cfg.wgmma) os << "#define FWD_PERSIST 1\n#define FWD_PSTAGES " << cfg.persist_stages() << "\n";
  if (cfg.fwd_keepbits && cfg.wgmma) os << "#define FWD_KEEPBITS 1\n";
  if (cfg.wgmma) os << "#define BWD_TMA 1\n";
  if (cfg.bwd_split_p) os << "#define BWD_SPLIT_P 1\n";
  os << "#define BWD_DKDV_MIN_BLOCKS " << cfg.bwd_dkdv_min_blocks << "\n";
  os << "#define BWD_DQ_MIN_BLOCKS " << cfg.bwd_dq_min_blocks << "\n";
  os << "#define FWD_MIN_BLOCKS " << cfg.fwd_min_blocks << "\n";
  if (cfg.fold_scale && !score) os << "#define FOLD_SCALE 1\n";
  if (cfg.fwd_last_issues && cfg.staged_tma_forward()) os << "#define FWD_LAST_ISSUES 1\n";
  if (cfg.merged_walk) os << "#define MERGED_WALK 1\n";
  if (cfg.mask_bits && cfg.wgmma && mask) os << "#define MASK_BITS 1\n";
  os << "#define NTHREADS " << kThreads << "\n";
  os << "#define NWARPS " << kWarps << "\n";
  os << "#define PRE_ROWS " << kPreRows << "\n";
  os << "#define HAS_SCORE " << (score ? 1 : 0) << "\n";
  os << "#define HAS_MASK " << (mask ? 1 : 0) << "\n";
  os << "#define HAS_CAP_GRAD " << (score && score->any_grad ? 1 : 0) << "\n";
  os << "#define SCORE_GRAD_ONE " << (score && detail::score_grad_is_one(*score) ? 1 : 0) << "\n";
  os << "#define KILN_PARAMS_SIZE " << sizeof(FlexParams) << "\n";
  os << "#include \"flex/cuda/device_common.cuh\"\n";
  os << generate_mod_functions(score, mask, cfg.fast_mods);
  if (cfg.mask_ranges && mask && !cfg.mask_bits) {
    const std::string ranges = mask_range_functions(*mask, cfg.fast_mods);
    if (!ranges.empty()) os << "#define MASK_RANGES 1\n" << ranges;
  }
  os << "#include \"flex/cuda/kernels.cuh\"\n";
  return os.str();
}

}  // namespace kiln::flex::cuda
