#pragma once
// Neural-network functions (torch.nn.functional names). Statistics (softmax max/sum, rms) are
// computed in fp32 for 16-bit inputs; outputs take the input dtype.
#include <optional>
#include <string>
#include <utility>

#include "kiln/tensor.h"

namespace kiln {

// x: any, softmax along dim -> x's shape
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

namespace nn::functional {

// indices: [...] int64/int32, weight: [num_embeddings, dim] -> [..., dim]
Tensor embedding(const Tensor& indices, const Tensor& weight);
// x: [..., H], weight: [H] or undefined -> [..., H]; y = x / sqrt(mean(x^2) + eps) * weight
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// Rotary position embedding, half-split convention (rotate_half, as in Llama/NeoX):
// x: [B, T, H, D], cos/sin: [T, D/2] -> [B, T, H, D]
Tensor apply_rotary_emb(const Tensor& x, const Tensor& cos, const Tensor& sin);
// cos/sin tables for positions [0, T): each [T, D/2] fp32, frequencies theta^(-2i/D).
std::pair<Tensor, Tensor> rotary_tables(int64_t T, int64_t D, double theta = 10000.0, Device device = kCPU);

enum class Reduction { Mean, Sum, None };

struct CrossEntropyOptions {
  Tensor weight;              // [C] class weights, optional
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
  double label_smoothing = 0.0;
};
// Unfused reference: logits [N, C], target [N] int64/int32 -> [] (mean/sum) or [N] (none).
// Mean with class weights divides by the sum of the targets' weights (PyTorch's rule).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

// Zeroes each element with probability p and scales the rest by 1/(1-p) (Philox mask).
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);

using kiln::gelu;
using kiln::linear;
using kiln::log_softmax;
using kiln::relu;
using kiln::silu;
using kiln::softmax;

}  // namespace nn::functional
}  // namespace kiln
