// torch.nn.functional counterparts: embedding, rms_norm, rotary embeddings, cross_entropy, dropout
// and kiln's fused linear_cross_entropy (kiln/nn/functional.py gives them PyTorch's signatures).
#include "bind.h"
#include "kiln/lce.h"
#include "kiln/ops.h"

namespace kiln::py {
namespace {

namespace F = kiln::nn::functional;

F::Reduction parse_reduction(const std::string& r, const char* op) {
  if (r == "mean") return F::Reduction::Mean;
  if (r == "sum") return F::Reduction::Sum;
  if (r == "none") return F::Reduction::None;
  KILN_FAIL(op, "reduction must be 'mean', 'sum' or 'none', got '", r, "'");
}

F::LceStrategy parse_strategy(const std::string& s) {
  if (s == "auto") return F::LceStrategy::Auto;
  if (s == "memory") return F::LceStrategy::Memory;
  if (s == "speed") return F::LceStrategy::Speed;
  KILN_FAIL("linear_cross_entropy", "strategy must be 'auto', 'memory' or 'speed', got '", s, "'");
}

const char* strategy_name(F::LceStrategy s) {
  switch (s) {
    case F::LceStrategy::Auto: return "auto";
    case F::LceStrategy::Memory: return "memory";
    case F::LceStrategy::Speed: return "speed";
  }
  return "?";
}

F::LinearCrossEntropyOptions lce_options(std::optional<Tensor> linear_bias, std::optional<Tensor> weight,
                                         const std::string& reduction, int64_t ignore_index, double label_smoothing,
                                         double z_loss, double logit_softcap, const std::string& strategy,
                                         int64_t chunk_tokens, int64_t chunk_vocab, int64_t memory_budget,
                                         const nb::dict& extras) {
  F::LinearCrossEntropyOptions o;
  if (linear_bias) o.linear_bias = *linear_bias;
  if (weight) o.weight = *weight;
  o.reduction = parse_reduction(reduction, "linear_cross_entropy");
  o.ignore_index = ignore_index;
  o.label_smoothing = label_smoothing;
  o.z_loss = z_loss;
  o.logit_softcap = logit_softcap;
  o.strategy = parse_strategy(strategy);
  o.chunk_tokens = chunk_tokens;
  o.chunk_vocab = chunk_vocab;
  o.memory_budget = memory_budget;
  // The flags of kiln/nn/functional.py's keyword-only options (it validates their names).
  auto flag = [&](const char* name) { return extras.contains(name) && nb::cast<bool>(extras[name]); };
  o.loss_in_input_dtype = flag("loss_in_input_dtype");
  o.use_token_scaling = flag("use_token_scaling");
  o.return_token_accuracy = flag("return_token_accuracy");
  o.return_predicted_tokens = flag("return_predicted_tokens");
  return o;
}

}  // namespace

void bind_nn(nb::module_& m) {
  const auto nogil = nb::call_guard<nb::gil_scoped_release>();
  m.def("embedding", &F::embedding, "input"_a, "weight"_a, "indices [...] int64/int32, weight [num, dim] -> [..., dim]");
  m.def("rms_norm",
        [](const Tensor& x, std::optional<Tensor> w, double eps, std::optional<DType> dtype) {
          return F::rms_norm(x, w ? *w : Tensor(), eps, dtype);
        },
        "input"_a, "weight"_a = nb::none(), "eps"_a = 1e-6, "dtype"_a = nb::none(),
        "x [..., H], weight [H] -> [..., H] in dtype (default x's)");
  m.def("add_rms_norm",
        [](const Tensor& x, const Tensor& residual, std::optional<Tensor> w, double eps, std::optional<DType> dtype) {
          return F::add_rms_norm(x, residual, w ? *w : Tensor(), eps, dtype);
        },
        "input"_a, "residual"_a, "weight"_a = nb::none(), "eps"_a = 1e-6, "dtype"_a = nb::none(),
        "x, residual [..., H], weight [H] -> (x + residual, rms_norm of it in dtype), one pass each way");
  m.def("swiglu", &F::swiglu, "gate"_a, "up"_a, "gate, up [...] -> silu(gate) * up, one pass each way");
  m.def("apply_rotary_emb", &F::apply_rotary_emb, "x"_a, "cos"_a, "sin"_a,
        "x [B, T, H, D], cos/sin [T, D/2] -> [B, T, H, D] (half-split rotation)");
  m.def("rotary_tables", &F::rotary_tables, "T"_a, "D"_a, "theta"_a = 10000.0, "device"_a = kCPU,
        "(cos, sin), each [T, D/2] float32");
  m.def("linear", [](const Tensor& x, const Tensor& w, std::optional<Tensor> b) { return linear(x, w, b ? *b : Tensor()); },
        "input"_a, "weight"_a, "bias"_a = nb::none(), nogil, "x [..., in], weight [out, in], bias [out] -> [..., out]");
  m.def("dropout", &F::dropout, "input"_a, "p"_a = 0.5, "training"_a = true);
  m.def("cross_entropy", [](const Tensor& logits, const Tensor& target, std::optional<Tensor> weight, int64_t ignore_index,
                            const std::string& reduction, double label_smoothing) {
    F::CrossEntropyOptions o;
    if (weight) o.weight = *weight;
    o.ignore_index = ignore_index;
    o.reduction = parse_reduction(reduction, "cross_entropy");
    o.label_smoothing = label_smoothing;
    return F::cross_entropy(logits, target, o);
  }, "input"_a, "target"_a, "weight"_a = nb::none(), "ignore_index"_a = -100, "reduction"_a = "mean",
  "label_smoothing"_a = 0.0, "logits [N, C], target [N] int -> [] (mean/sum) or [N] (none)");

  m.def("linear_cross_entropy",
        [](const Tensor& input, const Tensor& linear_weight, const Tensor& target, std::optional<Tensor> linear_bias,
           std::optional<Tensor> weight, const std::string& reduction, int64_t ignore_index, double label_smoothing,
           double z_loss, double logit_softcap, const std::string& strategy, int64_t chunk_tokens, int64_t chunk_vocab,
           int64_t memory_budget, bool return_stats, nb::dict extras) -> nb::object {
          auto o = lce_options(linear_bias, weight, reduction, ignore_index, label_smoothing, z_loss, logit_softcap,
                               strategy, chunk_tokens, chunk_vocab, memory_budget, extras);
          if (!return_stats) {
            Tensor loss;
            {
              nb::gil_scoped_release release;
              loss = F::linear_cross_entropy(input, linear_weight, target, o);
            }
            return nb::cast(loss);
          }
          F::LinearCrossEntropyResult r;
          {
            nb::gil_scoped_release release;
            r = F::linear_cross_entropy_with_stats(input, linear_weight, target, o);
          }
          auto opt = [](const Tensor& t) { return t.defined() ? nb::cast(t) : nb::none(); };
          return nb::make_tuple(r.loss, r.lse, r.z_loss, strategy_name(r.strategy), opt(r.token_accuracy),
                                opt(r.predicted_tokens));
        },
        "input"_a, "linear_weight"_a, "target"_a, "linear_bias"_a = nb::none(), "weight"_a = nb::none(),
        "reduction"_a = "mean", "ignore_index"_a = -100, "label_smoothing"_a = 0.0, "z_loss"_a = 0.0,
        "logit_softcap"_a = 0.0, "strategy"_a = "auto", "chunk_tokens"_a = 0, "chunk_vocab"_a = 0,
        "memory_budget"_a = 0, "return_stats"_a = false, "extras"_a = nb::dict(),
        "Fused cross_entropy(input @ linear_weight.T + linear_bias, target) that never materialises the logits.\n"
        "input [N, H] or [B, T, H]; linear_weight [V, H]; target [N] / [B, T] int -> loss [] (mean/sum) or "
        "target's shape (none), fp32 for 16-bit inputs. return_stats=True gives (loss, lse, z_loss, strategy, "
        "token_accuracy, predicted_tokens). extras: loss_in_input_dtype, use_token_scaling, "
        "return_token_accuracy, return_predicted_tokens (bools).");
}

}  // namespace kiln::py
