#pragma once
// kiln::Generator: an independent Philox 4x32-10 stream (torch.Generator) that the random
// functions take instead of the global generator. Each call reserves ceil(numel / 4) counters of
// the stream, so one seed gives the same numbers on the CPU and on CUDA, call after call.
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "kiln/tensor.h"

namespace kiln {

class Generator {
 public:
  explicit Generator(Device device = kCPU);
  Generator& manual_seed(uint64_t seed);  // restarts the stream at counter 0
  uint64_t seed();                        // reseeds from std::random_device; returns the seed
  uint64_t initial_seed() const;
  Device device() const;
  // int64 [2] CPU tensor {seed (bits), counter offset}; set_state restores it.
  Tensor get_state() const;
  Generator& set_state(const Tensor& state);
  // (seed, first counter) of a fresh block of ceil(numel / 4) counters.
  std::pair<uint64_t, uint64_t> reserve(int64_t numel) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// As rand / randn / randint (kiln/tensor.h), drawing from `generator`.
Tensor rand(const Shape& shape, const Generator& generator, TensorOptions options = {});
Tensor randn(const Shape& shape, const Generator& generator, TensorOptions options = {});
Tensor randint(int64_t low, int64_t high, const Shape& shape, const Generator& generator,
               TensorOptions options = kInt64);
// In place (not differentiable): self ~ N(mean, std^2) / U[from, to). generator null: the global one.
Tensor& normal_(Tensor& self, double mean = 0.0, double stddev = 1.0, const Generator* generator = nullptr);
Tensor& uniform_(Tensor& self, double from = 0.0, double to = 1.0, const Generator* generator = nullptr);
// A random permutation of [0, n) -> [n] (int64 by default): sorts random 53-bit keys drawn on
// options' device, on the host.
Tensor randperm(int64_t n, const Generator* generator = nullptr, TensorOptions options = kInt64);
// probs: [n] or [B, n] nonnegative weights (any floating dtype, need not sum to 1) ->
// int64 [num_samples] or [B, num_samples] category indices. Without replacement each category is
// drawn at most once (num_samples <= its nonzero weights). Sampling runs on the host from uniforms
// drawn on probs' device.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false,
                   const Generator* generator = nullptr);

}  // namespace kiln
