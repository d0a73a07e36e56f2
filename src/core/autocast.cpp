// Autocast state: one thread-local (enabled, dtype) pair per device type, as torch.autocast keeps
// it per thread; the casts are Tensor::to, so they record the usual differentiable copy.
#include "kiln/autocast.h"

#include "kiln/error.h"

namespace kiln {
namespace {

struct AutocastState {
  bool enabled[2] = {false, false};
  DType dtype[2] = {kBFloat16, kBFloat16};
};
thread_local AutocastState t_state;

int slot(DeviceType d) { return d == DeviceType::CUDA ? 1 : 0; }

// fp64 stays fp64 (PyTorch leaves float64 alone); only fp32/bf16/fp16 are cast.
bool castable(const Tensor& t) {
  return t.defined() && (t.dtype() == kFloat32 || t.dtype() == kBFloat16 || t.dtype() == kFloat16);
}

}  // namespace

bool is_autocast_enabled(DeviceType device_type) { return t_state.enabled[slot(device_type)]; }
void set_autocast_enabled(DeviceType device_type, bool enabled) { t_state.enabled[slot(device_type)] = enabled; }
DType get_autocast_dtype(DeviceType device_type) { return t_state.dtype[slot(device_type)]; }
void set_autocast_dtype(DeviceType device_type, DType dtype) {
  KILN_CHECK(dtype == kBFloat16 || dtype == kFloat16, "autocast", "the autocast dtype must be bfloat16 or float16, got ",
             dtype_name(dtype));
  t_state.dtype[slot(device_type)] = dtype;
}

AutocastGuard::AutocastGuard(DeviceType device_type, DType dtype, bool enabled)
    : device_type_(device_type),
      prev_enabled_(is_autocast_enabled(device_type)),
      prev_dtype_(get_autocast_dtype(device_type)) {
  set_autocast_dtype(device_type, dtype);
  set_autocast_enabled(device_type, enabled);
}

AutocastGuard::~AutocastGuard() {
  t_state.enabled[slot(device_type_)] = prev_enabled_;
  t_state.dtype[slot(device_type_)] = prev_dtype_;
}

namespace autocast {

Tensor cast_lower(const Tensor& t) {
  if (!castable(t) || !is_autocast_enabled(t.device().type)) return t;
  const DType d = get_autocast_dtype(t.device().type);
  return t.dtype() == d ? t : t.to(d);
}

Tensor cast_fp32(const Tensor& t) {
  if (!castable(t) || !is_autocast_enabled(t.device().type)) return t;
  return t.dtype() == kFloat32 ? t : t.to(kFloat32);
}

}  // namespace autocast
}  // namespace kiln
