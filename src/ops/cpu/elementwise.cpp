// CPU elementwise kernels: dispatch an op id and dtype to a functor from elementwise_ops.h and
// run it through elementwise_loop (scalar code the compiler may vectorise). Dense fp32/bf16
// operands of the hot ops take the Highway rows in elementwise_{unary,binary}_simd.cpp instead.
#include "ops/cpu/elementwise.h"

#include <cstring>
#include <type_traits>

#include "ops/cpu/elementwise_loop.h"
#include "ops/cpu/elementwise_simd.h"

namespace kiln::cpu {
namespace {

// One value broadcast to every element (an expanded one-element tensor): every stride of a
// dimension longer than one is zero.
bool is_broadcast_scalar(const Tensor& t) {
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.sizes()[i] > 1 && t.strides()[i] != 0) return false;
  return true;
}

// Runs the dense SIMD row when out/a(/b) are contiguous fp32 or bf16 and the op has one; a b
// broadcast from one value runs as a scalar operand. pow with a scalar exponent (binary_scalar,
// b == nullptr) keeps the scalar loop's powf, exact for small integer exponents.
bool try_simd_binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor* b, double bs, const EwParams& p) {
  if (!simd::has_binary(op) || !all_contiguous({&out, &a}) || (op == BinaryOp::Pow && !b)) return false;
  const Tensor* b_one = nullptr;  // b broadcast from its one element
  if (b && !b->is_contiguous()) {
    if (!is_broadcast_scalar(*b) || b->dtype() != out.dtype()) return false;
    b_one = b;
    b = nullptr;
  }
  const float alpha = static_cast<float>(p.alpha), lo = static_cast<float>(p.lo), hi = static_cast<float>(p.hi);
  if (out.dtype() == kFloat32) {
    const float s = b_one ? *b_one->data_ptr<float>() : static_cast<float>(bs);
    const float* a_ptr = a.data_ptr<float>();
    const float* b_ptr = b ? b->data_ptr<float>() : &s;
    float* o = out.data_ptr<float>();
    parallel_chunks(out.numel(), [&](int64_t i0, int64_t i1) {
      simd::binary_f32(op, a_ptr + i0, b ? b_ptr + i0 : b_ptr, !b, o + i0, i1 - i0, alpha, lo, hi);
    });
    return true;
  }
  if (out.dtype() == kBFloat16) {
    uint16_t s = BFloat16(static_cast<float>(bs)).bits;
    if (b_one) std::memcpy(&s, b_one->data_ptr(), 2);
    const uint16_t* a_ptr = reinterpret_cast<const uint16_t*>(a.data_ptr());
    const uint16_t* b_ptr = b ? reinterpret_cast<const uint16_t*>(b->data_ptr()) : &s;
    uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
    parallel_chunks(out.numel(), [&](int64_t i0, int64_t i1) {
      simd::binary_bf16(op, a_ptr + i0, b ? b_ptr + i0 : b_ptr, !b, o + i0, i1 - i0, alpha, lo, hi);
    });
    return true;
  }
  return false;
}

template <typename T>
constexpr bool is_float_compute = std::is_floating_point_v<acc_t<T>>;

}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const EwParams& p) {
  if (try_simd_binary(op, out, a, &b, 0.0, p)) return;
  dispatch_all(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    using ew::scalar_as;
    using ew::scalar_of;
    ew::visit(op, [&](auto c) {
      constexpr BinaryOp kOp = decltype(c)::value;
      if constexpr (std::is_same_v<T, bool> || (!is_float_compute<T> && !ew::integer_ok(kOp))) {
        KILN_FAIL("elementwise", "op not supported for ", dtype_name(out.dtype()));
      } else {
        elementwise_loop<T, T, T>(out, {&a, &b}, ew::Binary<kOp, A>{ew::wrapping_as<A>(p.alpha), scalar_as<A>(p.lo),
                                                                      scalar_as<A>(p.hi)});
      }
    });
  });
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double b, const EwParams& p) {
  if (try_simd_binary(op, out, a, nullptr, b, p)) return;
  dispatch_all(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    using ew::scalar_as;
    using ew::scalar_of;
    ew::visit(op, [&](auto c) {
      constexpr BinaryOp kOp = decltype(c)::value;
      if constexpr (std::is_same_v<T, bool> || !ew::scalar_ok(kOp) || (!is_float_compute<T> && !ew::integer_ok(kOp))) {
        KILN_FAIL("elementwise", "op not supported for ", dtype_name(out.dtype()));
      } else {
        using F = ew::Binary<kOp, A>;
        const F f{ew::wrapping_as<A>(p.alpha), scalar_as<A>(p.lo), scalar_as<A>(p.hi)};
        elementwise_loop<T, T>(out, {&a}, ew::BindRight<F, A>{f, ew::operand_of<kOp, T>(b)});
      }
    });
  });
}

void unary(UnaryOp op, const Tensor& out, const Tensor& x, const EwParams& p) {
  if (simd::has_unary(op) && all_contiguous({&out, &x})) {
    if (out.dtype() == kFloat32) {
      const float lo = ew::scalar_of<float>(p.lo), hi = ew::scalar_of<float>(p.hi);
      parallel_chunks(out.numel(), [&](int64_t i0, int64_t i1) {
        simd::unary_f32(op, x.data_ptr<float>() + i0, out.data_ptr<float>() + i0, i1 - i0, lo, hi);
      });
      return;
    }
    if (out.dtype() == kBFloat16) {
      const float lo = ew::scalar_of<BFloat16>(p.lo), hi = ew::scalar_of<BFloat16>(p.hi);
      parallel_chunks(out.numel(), [&](int64_t i0, int64_t i1) {
        simd::unary_bf16(op, reinterpret_cast<const uint16_t*>(x.data_ptr()) + i0,
                         reinterpret_cast<uint16_t*>(out.data_ptr()) + i0, i1 - i0, lo, hi);
      });
      return;
    }
  }
  dispatch_all(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    using ew::scalar_as;
    using ew::scalar_of;
    ew::visit(op, [&](auto c) {
      constexpr UnaryOp kOp = decltype(c)::value;
      if constexpr (std::is_same_v<T, bool> || (!is_float_compute<T> && !ew::integer_ok(kOp))) {
        KILN_FAIL("elementwise", "op not supported for ", dtype_name(out.dtype()));
      } else {
        // Clamp bounds round to the tensor's dtype, as a scalar operand would.
        elementwise_loop<T, T>(out, {&x}, ew::Unary<kOp, A>{scalar_of<T>(p.lo), scalar_of<T>(p.hi)});
      }
    });
  });
}

void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_all(a.dtype(), "compare", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ew::visit(op, [&](auto c) {
      elementwise_loop<bool, T, T>(out, {&a, &b}, ew::Compare<decltype(c)::value>{});
    });
  });
}

void compare_scalar(CompareOp op, const Tensor& out, const Tensor& a, double b) {
  dispatch_all(a.dtype(), "compare", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    using ew::scalar_as;
    using ew::scalar_of;
    ew::visit(op, [&](auto c) {
      elementwise_loop<bool, T>(out, {&a}, ew::CompareRight<decltype(c)::value, A>{scalar_of<T>(b)});
    });
  });
}

namespace {

// Dense where: per element the bytes of a or b (no conversion), in a loop the compiler
// vectorises; cond bytes read as bytes (nonzero = true), as the copies do.
template <typename U>
void where_dense(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  U* o = static_cast<U*>(out.data_ptr());
  const auto* c = static_cast<const uint8_t*>(cond.data_ptr());
  const U* x = static_cast<const U*>(a.data_ptr());
  const U* y = static_cast<const U*>(b.data_ptr());
  parallel_chunks(out.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {  // branch-free, both loads unconditional: vectorisable
      const U m = static_cast<U>(0) - static_cast<U>(c[i] != 0);
      o[i] = static_cast<U>((x[i] & m) | (y[i] & static_cast<U>(~m)));
    }
  });
}

bool try_where_dense(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (cond.dtype() != kBool || a.dtype() != out.dtype() || b.dtype() != out.dtype() || cond.numel() != n ||
      a.numel() != n || b.numel() != n || !all_contiguous({&out, &cond, &a, &b}))
    return false;
  switch (element_size(out.dtype())) {
    case 1: where_dense<uint8_t>(out, cond, a, b); return true;
    case 2: where_dense<uint16_t>(out, cond, a, b); return true;
    case 4: where_dense<uint32_t>(out, cond, a, b); return true;
    case 8: where_dense<uint64_t>(out, cond, a, b); return true;
    default: return false;
  }
}

}  // namespace

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (try_where_dense(out, cond, a, b)) return;
  dispatch_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    elementwise_loop<T, bool, T, T>(out, {&cond, &a, &b}, ew::Select<acc_t<T>>{});
  });
}

}  // namespace kiln::cpu
