#pragma once
// Checked size arithmetic: the element count and byte size of a shape, used by every allocation
// (make_tensor, so every factory), from_blob and every checkpoint loader, so a hostile or mistyped
// shape is a kiln::Error naming the op instead of a wrapped product.
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/tensor.h"

namespace kiln {

// The most bytes one tensor may span: byte offsets are signed 64-bit throughout.
inline constexpr uint64_t kMaxTensorBytes = static_cast<uint64_t>(INT64_MAX);

// Elements of `shape`; throws "[op] <what>shape [..] has a negative size" or "... has about 2^N
// elements: overflows ..." (`what` prefixes the message, e.g. "tensor 'w': ").
int64_t checked_numel(const Shape& shape, const char* op, std::string_view what = {});

// numel x element_bits / 8 for a type of `element_bits` bits named `dtype_name`; throws when it
// passes kMaxTensorBytes ("... of F32 is N elements x 4 bytes = B bytes: overflows ...") or is
// not a whole number of bytes.
uint64_t checked_nbytes(const Shape& shape, uint64_t element_bits, std::string_view dtype_name, const char* op,
                        std::string_view what = {});

}  // namespace kiln
