#pragma once
// Kernels behind the tensor core (copies, fills, random numbers), one set per backend.
// dst may be any strided tensor; src has dst's sizes (already expanded) and lives on dst's device.
#include <cstdint>

#include "core/philox.h"
#include "kiln/tensor.h"

namespace kiln::cpu {
void copy(const Tensor& dst, const Tensor& src);  // converts dtype
void fill(const Tensor& dst, double value);
void arange(const Tensor& dst, double start, double step);  // dst contiguous
void random(const Tensor& dst, philox::Distribution dist, uint64_t seed, uint64_t offset, int64_t low,
            int64_t high);  // dst contiguous
}  // namespace kiln::cpu

namespace kiln::cuda {
void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& dst, double value);
void arange(const Tensor& dst, double start, double step);
void random(const Tensor& dst, philox::Distribution dist, uint64_t seed, uint64_t offset, int64_t low,
            int64_t high);
// Raw transfers on the current stream of the CUDA side; host side must be contiguous.
void memcpy_host_to_device(void* dst, const void* src, size_t nbytes, int device);
void memcpy_device_to_host(void* dst, const void* src, size_t nbytes, int device);  // synchronises
}  // namespace kiln::cuda
