#pragma once
// How a strided matrix operand maps onto a row-major BLAS/cuBLASLt operand without a copy.
// Shared by the CPU and CUDA matmul paths (header-only, no CUDA).
#include <algorithm>
#include <cstdint>
#include <optional>

#include "kiln/tensor.h"

namespace kiln::linalg {

// A logical [rows, cols] operand read in place: trans == false means stored row-major with row
// stride ld; trans == true means stored as its transpose [cols, rows] row-major with row stride ld.
struct MatLayout {
  bool trans = false;
  int64_t ld = 1;
};

// rs/cs: element strides of the rows and columns. Dims of size 1 never constrain their stride.
// nullopt when neither dim is unit-stride with a leading dim that BLAS accepts (needs a copy).
inline std::optional<MatLayout> blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<int64_t>(cols, 1)))
    return MatLayout{false, rows == 1 ? std::max<int64_t>(cols, 1) : rs};
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<int64_t>(rows, 1)))
    return MatLayout{true, cols == 1 ? std::max<int64_t>(rows, 1) : cs};
  return std::nullopt;
}

// One matmul operand (2-D, or 3-D with a leading batch dim) as pointer + layout + batch stride,
// copied to contiguous first when its strides do not fit BLAS. `keep` holds that copy alive.
struct GemmOperand {
  Tensor keep;
  const void* ptr = nullptr;
  MatLayout layout;
  int64_t batch_stride = 0;  // elements; 0 for 2-D operands (or a batch-broadcast matrix)
};

inline GemmOperand gemm_operand(const Tensor& t_in) {
  Tensor t = t_in.detach();
  const int64_t r = t.dim() - 2, c = t.dim() - 1;
  auto layout = blas_layout(t.size(r), t.size(c), t.stride(r), t.stride(c));
  if (!layout) {
    t = t.contiguous();
    layout = blas_layout(t.size(r), t.size(c), t.stride(r), t.stride(c));
  }
  GemmOperand op;
  op.keep = t;
  op.ptr = t.data_ptr();
  op.layout = *layout;
  op.batch_stride = t.dim() == 3 && t.size(0) > 1 ? t.stride(0) : 0;
  return op;
}

}  // namespace kiln::linalg
