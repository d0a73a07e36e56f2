// nn::functional::embedding: a row gather of the weight table, whose backward accumulates
// gradient rows into a [num_embeddings, dim] tensor deterministically (a stable sort of the
// token ids, then one warp per vocabulary row on CUDA / one task per row on the CPU; see
// ops/cuda/index_add.cu). Shares its kernels with index_select along dim 0.
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/indexing_internal.h"

namespace kiln::nn::functional {

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  KILN_CHECK(weight.defined(), "embedding", "weight is undefined");
  KILN_CHECK(weight.dim() == 2, "embedding", "weight must be [num_embeddings, dim], got ",
             shape_str(weight.sizes()));
  indexing::check_index_tensor(indices, weight, "embedding", "indices");
  const int64_t num_embeddings = weight.sizes()[0], dim = weight.sizes()[1];
  const Tensor flat = indices.contiguous().reshape({-1});
  indexing::check_indices(flat, num_embeddings, "embedding", 0);
  Shape shape = indices.sizes();
  shape.push_back(dim);
  // The kernel writes a contiguous [tokens, dim] block, which is `shape` row-major.
  Tensor rows = indexing::index_select_raw(weight, 0, flat, {flat.numel(), dim});
  Tensor out = make_view(rows, shape, contiguous_strides(shape), rows.storage_offset());
  if (autograd::needs_grad({weight})) {
    const SavedTensor saved(flat);
    const int64_t tokens = flat.numel();
    autograd::record("embedding", {out}, {weight}, [saved, num_embeddings, tokens, dim](const std::vector<Tensor>& g) {
      const Tensor idx = saved.unpack("embedding");
      return std::vector<Tensor>{indexing::index_add_zeros(g[0].reshape({tokens, dim}), 0, idx, num_embeddings)};
    });
  }
  return out;
}

}  // namespace kiln::nn::functional
