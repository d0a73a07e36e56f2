// The CUDA API of kiln/cuda.h when kiln is built without CUDA: every call raises.
#ifndef KILN_WITH_CUDA
#include "core/device_check.h"
#include "kiln/cuda.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {
[[noreturn]] void unavailable(const char* what) { KILN_FAIL(what, detail::cuda_unavailable_reason(0)); }
}  // namespace
Stream Stream::create(int) { unavailable("cuda.Stream.create"); }
void Stream::synchronize() const { unavailable("cuda.Stream.synchronize"); }
Stream current_stream(int) { unavailable("cuda.current_stream"); }
void set_current_stream(const Stream&) { unavailable("cuda.set_current_stream"); }
int current_device() { unavailable("cuda.current_device"); }
void set_device(int) { unavailable("cuda.set_device"); }
void synchronize(int) { unavailable("cuda.synchronize"); }
StreamGuard::StreamGuard(const Stream&) { unavailable("cuda.StreamGuard"); }
StreamGuard::~StreamGuard() = default;
Event::Event() { unavailable("cuda.Event"); }
void Event::record(const Stream&) { unavailable("cuda.Event.record"); }
void Event::synchronize() const { unavailable("cuda.Event.synchronize"); }
float Event::elapsed_ms(const Event&) const { unavailable("cuda.Event.elapsed_ms"); }
}  // namespace kiln::cuda
#endif
