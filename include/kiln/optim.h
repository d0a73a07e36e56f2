#pragma once
// Optimizers and their helpers (torch.optim names): AdamW with one fused kernel per parameter
// per step, SGD with momentum, global-norm gradient clipping, and a warmup + cosine learning-rate schedule.
#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::optim {

// PyTorch's torch.optim.AdamW defaults.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: param *= 1 - lr * weight_decay before the Adam update
};

struct ParamGroup {
  std::vector<Tensor> params;
  AdamWOptions options;
};

// One parameter's state (PyTorch's state_dict()["state"][i]). The moments are fp32 for bf16/fp16
// parameters and the parameter's dtype otherwise; undefined until the first step.
struct AdamWState {
  int64_t step = 0;
  Tensor exp_avg;
  Tensor exp_avg_sq;
};

// AdamW (Loshchilov & Hutter) exactly as torch.optim.AdamW (amsgrad=False, maximize=False):
//   p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Each parameter is updated in place by one kernel that reads p, g, m, v once and writes p, m, v.
class AdamW {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<ParamGroup> groups);

  // Updates every parameter that has a gradient (others are skipped, as in PyTorch).
  void step();
  // set_to_none drops the gradients (PyTorch's default); otherwise they are zeroed in place.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  void set_lr(double lr);  // every group
  double lr() const;       // group 0's

  // State by flat parameter index (groups in order, params in order), as PyTorch numbers them in
  // state_dict(); for checkpoints.
  const std::vector<AdamWState>& state() const { return state_; }
  AdamWState& state(size_t index);
  // Replaces the state (a checkpoint being restored): one entry per parameter, moments of the
  // parameter's shape (moved to its device and the state dtype), or undefined with step 0.
  void load_state(const std::vector<AdamWState>& state);

 private:
  std::vector<ParamGroup> groups_;
  std::vector<AdamWState> state_;
};

// PyTorch's torch.optim.SGD defaults (momentum off).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // coupled: g += weight_decay * p
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
  bool maximize = false;
};

struct SGDParamGroup {
  std::vector<Tensor> params;
  SGDOptions options;
};

// SGD with momentum exactly as torch.optim.SGD (single-tensor path):
//   g = (maximize ? -grad : grad) + wd p;  b = g on the first step, else momentum b + (1 - dampening) g
//   p -= lr (nesterov ? g + momentum b : b)        (b = g when momentum == 0)
// The momentum buffer (state) is fp32 for bf16/fp16 parameters, where the update is computed in fp32.
class SGD {
 public:
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {});
  explicit SGD(std::vector<SGDParamGroup> groups);

  void step();  // parameters without a gradient are skipped
  void zero_grad(bool set_to_none = true);

  std::vector<SGDParamGroup>& param_groups() { return groups_; }
  const std::vector<SGDParamGroup>& param_groups() const { return groups_; }
  void set_lr(double lr);  // every group
  double lr() const;       // group 0's

  // Momentum buffers by flat parameter index (undefined before the first step with momentum).
  const std::vector<Tensor>& state() const { return momentum_buffers_; }
  // Restores buffers (one per parameter, of its shape, or undefined).
  void load_state(const std::vector<Tensor>& momentum_buffers);

 private:
  std::vector<SGDParamGroup> groups_;
  std::vector<Tensor> momentum_buffers_;
};

// Scales all gradients by min(1, max_norm / (total_norm + 1e-6)) in place, where total_norm is
// the L2 norm of all gradients together (fp64 accumulation in a fixed order: deterministic).
// Params without a gradient are skipped; gradients must share one device.
// -> total_norm (before clipping): [] float32 on the gradients' device. No host sync on CUDA.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// Learning rate at optimizer step `step` (0-based): linear warmup max_lr * (step + 1) / warmup_steps
// for step < warmup_steps, then cosine decay from max_lr to min_lr at total_steps, min_lr after.
double warmup_cosine_lr(int64_t step, int64_t warmup_steps, int64_t total_steps, double max_lr,
                        double min_lr = 0.0);

}  // namespace kiln::optim
