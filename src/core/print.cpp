// torch-like printing: tensor([[1.0000, 2.0000]], dtype=bfloat16, device='cuda:0')
#include <cmath>
#include <iomanip>
#include <sstream>

#include "kiln/tensor.h"

namespace kiln {
namespace {

void print_rec(std::ostream& os, const std::vector<double>& v, const Shape& sizes, size_t dim, int64_t& pos,
               bool is_float, int indent) {
  if (dim == sizes.size()) {
    const double x = v[pos++];
    if (!is_float) {
      os << static_cast<int64_t>(x);
    } else if (std::isnan(x)) {
      os << "nan";
    } else if (std::isinf(x)) {
      os << (x > 0 ? "inf" : "-inf");
    } else {
      os << std::fixed << std::setprecision(4) << x;
    }
    return;
  }
  os << "[";
  const int64_t n = sizes[dim];
  const bool elide = n > 6;
  const std::string sep = dim + 1 == sizes.size() ? ", " : ",\n" + std::string(indent + 1, ' ');
  int64_t inner = 1;
  for (size_t d = dim + 1; d < sizes.size(); ++d) inner *= sizes[d];
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) os << sep;
    if (elide && i == 3) {  // print the first and last three, like torch
      os << "..." << sep;
      pos += inner * (n - 6);
      i = n - 3;
    }
    print_rec(os, v, sizes, dim + 1, pos, is_float, indent + 1);
  }
  os << "]";
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  const std::vector<double> v = to_vector();
  int64_t pos = 0;
  if (numel() == 0) {
    os << "[]";
  } else {
    print_rec(os, v, sizes(), 0, pos, is_floating_point(dtype()), 7);
  }
  if (dtype() != kFloat32 && dtype() != kInt64) os << ", dtype=" << dtype_name(dtype());
  if (device().is_cuda()) os << ", device='" << device().str() << "'";
  if (requires_grad()) os << ", requires_grad=True";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace kiln
