#pragma once
// Automatic mixed precision (torch.autocast). Thread-local, per device type. Inside an enabled
// region:
//   - matmul-like ops (mm, bmm, matmul, linear; the GPT job also casts FlexAttention and fused
//     linear-cross-entropy inputs) cast floating inputs to the autocast dtype (bf16 by default)
//     and run in it;
//   - precision-sensitive ops (rms_norm, softmax, log_softmax, cross_entropy) cast their inputs
//     to fp32;
//   - everything else runs in its inputs' dtypes (binary ops promote, so bf16 + fp32 -> fp32).
// The casts are ordinary differentiable copies (Tensor::to), so gradients reach fp32 master
// weights in fp32. As in PyTorch, run backward() outside the region.
//
//   { AutocastGuard ac(kCUDA, kBFloat16); loss = model.loss(...); }  loss.backward();
//
// Autocast is allowed on the CPU too (bf16), like torch.autocast("cpu").
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"

namespace kiln {

bool is_autocast_enabled(DeviceType device_type);
void set_autocast_enabled(DeviceType device_type, bool enabled);
DType get_autocast_dtype(DeviceType device_type);  // default bf16 on both device types
void set_autocast_dtype(DeviceType device_type, DType dtype);  // bf16 or fp16

// Enables (or, with enabled = false, disables) autocast for one device type for a scope, and
// restores the previous state and dtype on exit. Nesting works like torch.autocast.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device_type, DType dtype = kBFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool prev_enabled_;
  DType prev_dtype_;
};

namespace autocast {
// For op entry points. With autocast enabled for t's device type, a floating-point t of another
// dtype becomes t.to(autocast dtype) (lower) / t.to(fp32) (fp32); fp64 and integer tensors,
// undefined tensors, and everything outside a region pass through unchanged.
Tensor cast_lower(const Tensor& t);
Tensor cast_fp32(const Tensor& t);
}  // namespace autocast

}  // namespace kiln
