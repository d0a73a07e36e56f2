#include "core/cuda/tensor_map.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "kiln/error.h"

namespace kiln::cuda {

void* driver_entry(const char* name, const char* op) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status);
  KILN_CHECK(e == cudaSuccess && status == cudaDriverEntryPointSuccess && fn != nullptr, op,
             "cannot reach the CUDA driver function ", name, " (", cudaGetErrorString(e), ")");
  return fn;
}

namespace {

using PfnEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                    const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

}  // namespace

void encode_tensor_map(void* map, MapElem elem, const void* base, int rank, int64_t outer, int64_t rows,
                       int64_t cols, int box_cols, int box_rows, const char* op) {
  KILN_CHECK(rank == 2 || rank == 3, op, "tensor maps of rank 2 or 3, got ", rank);
  static const auto encode = reinterpret_cast<PfnEncodeTiled>(driver_entry("cuTensorMapEncodeTiled", op));
  const CUtensorMapDataType type = elem == MapElem::BFloat16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : elem == MapElem::Float16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const size_t bytes = elem == MapElem::Float32 ? 4 : 2;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * bytes, static_cast<cuuint64_t>(rows * cols) * bytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1},
                   unit[3] = {1, 1, 1};
  const CUresult r =
      encode(static_cast<CUtensorMap*>(map), type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims,
             strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KILN_CHECK(r == CUDA_SUCCESS, op, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a [",
             outer, ", ", rows, ", ", cols, "] tensor with boxes of [", box_rows, ", ", box_cols, "]");
}

}  // namespace kiln::cuda
