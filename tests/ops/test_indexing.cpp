// cat, stack, index_select, gather, scatter_add: float64 plain-loop references on fresh random
// inputs and indices (with repeats), non-contiguous inputs, negative dims, int32/int64 indices,
// float64 gradchecks, CPU-vs-CUDA, determinism and error messages.
#include <cstring>

#include "indexing_test_util.h"

extern "C" void omp_set_num_threads(int);  // kiln links OpenMP; used to vary the thread count
extern "C" int omp_get_max_threads();

namespace kiln::testing {
namespace {

using idx::expect_error;
using idx::flat;
using idx::for_each_index;
using idx::from_values;
using idx::random_of;

const std::vector<DType> kFloatTypes = {kFloat32, kFloat64, kBFloat16, kFloat16};
const std::vector<DType> kAllTypes = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32, kUInt8};

double tol_of(DType dt) { return is_floating_point(dt) ? tolerance(dt) : 0.0; }

// ---- references ----

Tensor ref_index_select(const Tensor& x, int64_t d, const Tensor& index) {
  const std::vector<double> xv = x.to_vector(), iv = index.to_vector();
  Shape shape = x.sizes();
  shape[d] = static_cast<int64_t>(iv.size());
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  for_each_index(shape, [&](const std::vector<int64_t>& ix) {
    std::vector<int64_t> src = ix;
    src[d] = static_cast<int64_t>(iv[ix[d]]);
    out[flat(shape, ix)] = xv[flat(x.sizes(), src)];
  });
  return from_values(out, shape);
}

Tensor ref_gather(const Tensor& x, int64_t d, const Tensor& index) {
  const std::vector<double> xv = x.to_vector(), iv = index.to_vector();
  std::vector<double> out(iv.size());
  for_each_index(index.sizes(), [&](const std::vector<int64_t>& ix) {
    std::vector<int64_t> src = ix;
    src[d] = static_cast<int64_t>(iv[flat(index.sizes(), ix)]);
    out[flat(index.sizes(), ix)] = xv[flat(x.sizes(), src)];
  });
  return from_values(out, index.sizes());
}

Tensor ref_scatter_add(const Tensor& x, int64_t d, const Tensor& index, const Tensor& src) {
  std::vector<double> out = x.to_vector();
  const std::vector<double> iv = index.to_vector(), sv = src.to_vector();
  for_each_index(index.sizes(), [&](const std::vector<int64_t>& ix) {
    std::vector<int64_t> dst = ix;
    dst[d] = static_cast<int64_t>(iv[flat(index.sizes(), ix)]);
    out[flat(x.sizes(), dst)] += sv[flat(src.sizes(), ix)];
  });
  return from_values(out, x.sizes());
}

Tensor ref_cat(const std::vector<Tensor>& ts, int64_t d) {
  Shape shape = ts[0].sizes();
  shape[d] = 0;
  for (const Tensor& t : ts) shape[d] += t.sizes()[d];
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  int64_t off = 0;
  for (const Tensor& t : ts) {
    const std::vector<double> v = t.to_vector();
    for_each_index(t.sizes(), [&](const std::vector<int64_t>& ix) {
      std::vector<int64_t> o = ix;
      o[d] += off;
      out[flat(shape, o)] = v[flat(t.sizes(), ix)];
    });
    off += t.sizes()[d];
  }
  return from_values(out, shape);
}

// ---- cat / stack ----

TEST(Cat, MatchesReferenceAllDtypesAndDims) {
  for (DType dt : kAllTypes) {
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      std::vector<Tensor> ts;
      for (int64_t len : {2, 1, 4}) {
        Shape s = {3, 4, 5};
        s[d] = len;
        ts.push_back(random_of(s, dt));
      }
      // A transposed (non-contiguous) member.
      Shape s = {3, 4, 5};
      s[d] = 3;
      ts.push_back(random_of({s[2], s[1], s[0]}, dt).transpose(0, 2));
      const Tensor out = cat(ts, dim);
      ASSERT_EQ(out.dtype(), dt);
      EXPECT_CLOSE(out, ref_cat(ts, d), tol_of(dt));
    }
  }
}

TEST(Cat, PromotesDtypesAndSkipsLegacyEmpty) {
  const Tensor a = randn({2, 3}), b = randn({1, 3}, kFloat64), e = empty({0});
  const Tensor out = cat({a, e, b}, 0);
  EXPECT_EQ(out.dtype(), kFloat64);
  EXPECT_CLOSE(out, ref_cat({a.to(kFloat64), b}, 0), 1e-15);
}

TEST(Cat, Gradcheck) {
  const Tensor a = randn({2, 3}, kFloat64).requires_grad_(), b = randn({2, 1}, kFloat64).requires_grad_(),
               c = randn({2, 2}, kFloat64).requires_grad_();
  expect_gradcheck([](const std::vector<Tensor>& in) { return cat(in, -1); }, {a, b, c});
  // Mixed: only some inputs require grad.
  const Tensor d = randn({2, 4}, kFloat64);
  expect_gradcheck([&](const std::vector<Tensor>& in) { return cat({in[0], d}, 1); }, {a});
}

TEST(Stack, MatchesReferenceAndGradcheck) {
  for (DType dt : kAllTypes) {
    for (int64_t dim : {0, 1, 2, -1}) {
      std::vector<Tensor> ts = {random_of({3, 4}, dt), random_of({4, 3}, dt).t(), random_of({3, 4}, dt)};
      const Tensor out = stack(ts, dim);
      const int64_t d = dim < 0 ? dim + 3 : dim;
      std::vector<Tensor> un;
      for (const Tensor& t : ts) un.push_back(t.unsqueeze(d));
      EXPECT_EQ(out.dim(), 3);
      EXPECT_CLOSE(out, ref_cat(un, d), tol_of(dt));
    }
  }
  const Tensor a = randn({2, 3}, kFloat64).requires_grad_(), b = randn({2, 3}, kFloat64).requires_grad_();
  expect_gradcheck([](const std::vector<Tensor>& in) { return stack(in, 1); }, {a, b});
}

// ---- index_select ----

TEST(IndexSelect, MatchesReferenceAllDtypesDimsIndexTypes) {
  for (DType dt : kAllTypes) {
    for (DType it : {kInt64, kInt32}) {
      for (int64_t dim : {0, 1, 2, -1, -2}) {
        const Tensor x = random_of({4, 6, 5}, dt);
        const int64_t d = dim < 0 ? dim + 3 : dim;
        const Tensor index = randint(0, x.size(d), {9}, it);  // 9 draws from <= 6: repeats
        EXPECT_CLOSE(index_select(x, dim, index), ref_index_select(x, d, index), tol_of(dt));
        // Non-contiguous input (strided fallback) and a sliced, strided index.
        const Tensor xt = random_of({5, 6, 4}, dt).transpose(0, 2);
        const Tensor idx2 = randint(0, xt.size(d), {14}, it).slice(0, 0, 14, 2);
        EXPECT_CLOSE(index_select(xt, dim, idx2), ref_index_select(xt, d, idx2), tol_of(dt));
      }
    }
  }
}

TEST(IndexSelect, BackwardAccumulatesRepeats) {
  for (DType dt : kFloatTypes) {
    const Tensor x = randn({5, 8}).to(dt).requires_grad_();
    const Tensor index = randint(0, 5, {20});
    const Tensor out = index_select(x, 0, index);
    const Tensor g = randn(out.sizes()).to(dt);
    out.backward(g);
    std::vector<double> ref(40, 0.0);
    const std::vector<double> gv = g.to_vector(), iv = index.to_vector();
    for (int i = 0; i < 20; ++i)
      for (int c = 0; c < 8; ++c) ref[static_cast<int64_t>(iv[i]) * 8 + c] += gv[i * 8 + c];
    EXPECT_CLOSE(x.grad(), from_values(ref, {5, 8}), tolerance(dt));
  }
}

TEST(IndexSelect, Gradcheck) {
  const Tensor x = randn({4, 3, 2}, kFloat64).requires_grad_();
  for (int64_t dim : {0, 1, -1}) {
    const Tensor index = randint(0, x.size(dim), {5}, kInt32);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], dim, index); }, {x});
  }
  // Strided input.
  const Tensor index = randint(0, 3, {6});
  expect_gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0].t(), 1, index); },
                   {randn({3, 4}, kFloat64).requires_grad_()});
}

TEST(IndexSelect, DoubleBackward) {
  // d/dx of <index_select_backward(g), v> w.r.t. g is index_select(v): check through autograd::grad.
  const Tensor x = randn({4, 3}, kFloat64).requires_grad_();
  const Tensor index = randint(0, 4, {6});
  const Tensor g = randn({6, 3}, kFloat64).requires_grad_();
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        const bool previous = is_grad_enabled();  // gradcheck evaluates f under no_grad too
        set_grad_enabled(true);
        const Tensor out = index_select(x, 0, index);
        Tensor r = autograd::grad({out}, {x}, {in[0]}, /*retain_graph=*/true, /*create_graph=*/true)[0];
        set_grad_enabled(previous);
        return r;
      },
      {g});
}

TEST(IndexSelect, BackwardIndependentOfThreadCount) {
  const Tensor x = randn({300, 128}).requires_grad_();
  const Tensor index = randint(0, 300, {4000});
  const Tensor g = randn({4000, 128});
  const int saved = omp_get_max_threads();
  std::vector<std::vector<double>> grads;
  for (int threads : {1, 2, 3, 8}) {
    omp_set_num_threads(threads);
    x.set_grad(Tensor());
    index_select(x, 0, index).backward(g);
    grads.push_back(x.grad().to_vector());
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < grads.size(); ++i)
    EXPECT_EQ(std::memcmp(grads[0].data(), grads[i].data(), grads[0].size() * sizeof(double)), 0);
}

// ---- gather / scatter_add ----

TEST(Gather, MatchesReferenceAllDtypesDims) {
  for (DType dt : kAllTypes) {
    for (DType it : {kInt64, kInt32}) {
      for (int64_t dim : {0, 1, 2, -1}) {
        const Tensor x = random_of({4, 5, 6}, dt);
        const int64_t d = dim < 0 ? dim + 3 : dim;
        Shape is = {3, 4, 5};
        is[d] = 7;  // larger than some dims along `dim` is allowed
        const Tensor index = randint(0, x.size(d), is, it);
        EXPECT_CLOSE(gather(x, dim, index), ref_gather(x, d, index), tol_of(dt));
        const Tensor xt = random_of({6, 5, 4}, dt).permute({2, 1, 0});
        const Tensor it2 = randint(0, x.size(d), {is[2], is[1], is[0]}, it).permute({2, 1, 0});
        EXPECT_CLOSE(gather(xt, dim, it2), ref_gather(xt, d, it2), tol_of(dt));
      }
    }
  }
}

TEST(ScatterAdd, MatchesReferenceAllDtypesDims) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32}) {
    for (DType it : {kInt64, kInt32}) {
      for (int64_t dim : {0, 1, -1}) {
        const Tensor x = random_of({4, 5, 6}, dt);
        const int64_t d = dim < 0 ? dim + 3 : dim;
        Shape is = {3, 4, 5};
        is[d] = 9;  // many sources per destination: accumulation
        const Tensor index = randint(0, x.size(d), is, it);
        Shape ss = is;
        for (auto& s : ss) s += 1;  // src larger than index: only index's extent is read
        const Tensor src = random_of(ss, dt);
        const Tensor out = scatter_add(x, dim, index, src);
        ASSERT_EQ(out.dtype(), dt);
        // 16-bit: the reference adds the same 16-bit inputs in float64; kiln accumulates in fp32.
        EXPECT_CLOSE(out, ref_scatter_add(x, d, index, src), tol_of(dt));
        const Tensor xt = random_of({6, 5, 4}, dt).transpose(0, 2);
        const Tensor st = random_of({ss[2], ss[1], ss[0]}, dt).transpose(0, 2);
        EXPECT_CLOSE(scatter_add(xt, dim, index, st), ref_scatter_add(xt, d, index, st), tol_of(dt));
      }
    }
  }
}

TEST(GatherScatter, Gradcheck) {
  const Tensor x = randn({4, 5}, kFloat64).requires_grad_();
  for (int64_t dim : {0, 1}) {
    const Shape is = dim == 0 ? Shape{6, 4} : Shape{3, 7};
    const Tensor index = randint(0, x.size(dim), is);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return gather(in[0], dim, index); }, {x});
    const Tensor src = randn({is[0] + 1, is[1] + 1}, kFloat64).requires_grad_();  // larger than index
    expect_gradcheck([&](const std::vector<Tensor>& in) { return scatter_add(in[0], dim, index, in[1]); },
                     {x, src});
  }
}

TEST(GatherScatter, BackwardMatchesReference) {
  // gather's gradient is scatter_add of g into zeros; scatter_add's src gradient is gather(g).
  const Tensor x = randn({6, 7}).requires_grad_();
  const Tensor index = randint(0, 6, {10, 7});
  const Tensor out = gather(x, 0, index);
  const Tensor g = randn(out.sizes());
  out.backward(g);
  EXPECT_CLOSE(x.grad(), ref_scatter_add(zeros({6, 7}), 0, index, g), 1e-6);

  const Tensor y = randn({6, 7}).requires_grad_(), src = randn({10, 7}).requires_grad_();
  const Tensor out2 = scatter_add(y, 0, index, src);
  const Tensor g2 = randn(out2.sizes());
  out2.backward(g2);
  EXPECT_CLOSE(y.grad(), g2, 0.0);
  EXPECT_CLOSE(src.grad(), ref_gather(g2, 0, index), 0.0);
}

// ---- errors ----

TEST(IndexingErrors, IndexOutOfRange) {
  const Tensor x = randn({5, 3});
  expect_error([&] { index_select(x, 0, tensor({0, 5, 1}, kInt64)); },
               {"[index_select]", "index 5", "dim 0", "[0, 5)"});
  expect_error([&] { index_select(x, 1, tensor({-1}, kInt32)); }, {"[index_select]", "index -1", "[0, 3)"});
  expect_error([&] { gather(x, 0, tensor({0, 1, 2, 3, 4, 9}, kInt64).reshape({2, 3})); },
               {"[gather]", "index 9", "[0, 5)"});
  expect_error([&] { scatter_add(x, 1, tensor({-2}, kInt64).reshape({1, 1}), randn({1, 1})); },
               {"[scatter_add]", "index -2", "[0, 3)"});
}

TEST(IndexingErrors, ShapesDtypesAndEmptyLists) {
  expect_error([&] { cat({randn({2, 3}), randn({2, 4}), randn({3, 3})}, 0); },
               {"[cat]", "tensor 1", "dim 1", "size 4"});
  expect_error([&] { cat({randn({2, 3}), randn({2, 3, 1})}, 0); }, {"[cat]", "tensor 1", "3 dims"});
  expect_error([&] { cat({}, 0); }, {"[cat]", "non-empty"});
  expect_error([&] { stack({}, 0); }, {"[stack]", "non-empty"});
  expect_error([&] { stack({randn({2, 3}), randn({3, 2})}, 0); }, {"[stack]", "tensor 1"});
  expect_error([&] { cat({randn({2, 3})}, 2); }, {"[cat]", "dim 2"});
  expect_error([&] { index_select(randn({4}), 0, tensor({0, 1}, kFloat32)); }, {"[index_select]", "int64 or int32"});
  expect_error([&] { gather(randn({4}), 0, tensor({0}, kUInt8)); }, {"[gather]", "int64 or int32"});
  expect_error([&] { index_select(randn({4}), 0, randint(0, 4, {2, 2})); }, {"[index_select]", "1-d"});
  expect_error([&] { gather(randn({4, 3}), 0, randint(0, 4, {2, 4})); }, {"[gather]", "dim 1"});
  expect_error([&] { gather(randn({4, 3}), 0, randint(0, 4, {2})); }, {"[gather]", "rank"});
  expect_error([&] { scatter_add(randn({4, 3}), 0, randint(0, 4, {2, 3}), randn({2, 3}, kFloat64)); },
               {"[scatter_add]", "dtype"});
  expect_error([&] { scatter_add(randn({4, 3}), 0, randint(0, 4, {2, 3}), randn({1, 3})); },
               {"[scatter_add]", "src"});
}

// ---- CUDA ----

TEST(IndexingCuda, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = randn({3, 4}).to(dt).requires_grad_(), b = randn({3, 2}).to(dt).requires_grad_();
    expect_cuda_matches_cpu("cat", [](const std::vector<Tensor>& in) { return cat(in, 1); }, {a, b});
    expect_cuda_matches_cpu("stack", [](const std::vector<Tensor>& in) { return stack({in[0], in[0]}, -1); }, {a});
    for (DType it : {kInt64, kInt32}) {
      const Tensor x = randn({50, 24}).to(dt).requires_grad_();
      const Tensor index = randint(0, 50, {300}, it);
      expect_cuda_matches_cpu(
          "index_select", [](const std::vector<Tensor>& in) { return index_select(in[0], 0, in[1]); }, {x, index});
      expect_cuda_matches_cpu(
          "index_select strided",
          [](const std::vector<Tensor>& in) { return index_select(in[0].t(), 1, in[1]); }, {x, index});
      const Tensor gi = randint(0, 50, {70, 24}, it);
      expect_cuda_matches_cpu("gather", [](const std::vector<Tensor>& in) { return gather(in[0], 0, in[1]); },
                              {x, gi});
      const Tensor src = randn({70, 24}).to(dt).requires_grad_();
      expect_cuda_matches_cpu(
          "scatter_add", [](const std::vector<Tensor>& in) { return scatter_add(in[0], 0, in[1], in[2]); },
          {x, gi, src});
      const Tensor gi1 = randint(0, 24, {50, 30}, it);
      expect_cuda_matches_cpu("gather dim 1",
                              [](const std::vector<Tensor>& in) { return gather(in[0], -1, in[1]); }, {x, gi1});
    }
  }
  // Integer data (forward only).
  const Tensor xi = randint(-9, 9, {20, 6}, kInt32), index = randint(0, 20, {33});
  expect_cuda_matches_cpu("index_select int32",
                          [](const std::vector<Tensor>& in) { return index_select(in[0], 0, in[1]); }, {xi, index});
}

TEST(IndexingCuda, DeterministicBackward) {
  KILN_REQUIRE_CUDA();
  const Tensor index = randint(0, 64, {5000}).to(Device("cuda"));
  const Tensor g = randn({5000, 96}).to(Device("cuda"));
  const Tensor gi = randint(0, 64, {5000, 96}).to(Device("cuda"));
  std::vector<std::vector<double>> runs_select, runs_gather;
  for (int r = 0; r < 3; ++r) {
    const Tensor x = randn({64, 96}).to(Device("cuda")).requires_grad_();
    index_select(x, 0, index).backward(g);
    runs_select.push_back(x.grad().to_vector());
    const Tensor y = randn({64, 96}).to(Device("cuda")).requires_grad_();
    gather(y, 0, gi).backward(g);
    runs_gather.push_back(y.grad().to_vector());
  }
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(runs_select[0], runs_select[r]) << "index_select backward differs between runs";
    EXPECT_EQ(runs_gather[0], runs_gather[r]) << "gather backward differs between runs";
  }
}

TEST(IndexingCuda, Errors) {
  KILN_REQUIRE_CUDA();
  const Tensor x = randn({5, 3}).to(Device("cuda"));
  expect_error([&] { index_select(x, 0, tensor({0, 7, 1}, kInt64).to(Device("cuda"))); },
               {"[index_select]", "index 7", "position 1", "[0, 5)"});
  expect_error([&] { gather(x, 1, tensor({-4}, kInt32).reshape({1, 1}).to(Device("cuda"))); },
               {"[gather]", "index -4"});
  expect_error([&] { index_select(x, 0, tensor({0}, kInt64)); }, {"[index_select]", "cpu"});
  expect_error([&] { cat({x, randn({5, 3})}, 0); }, {"[cat]", "tensor 1", "cpu"});
  expect_error([&] { scatter_add(x, 0, randint(0, 5, {1, 3}).to(Device("cuda")), randn({1, 3})); },
               {"[scatter_add]", "src"});
  // The context stays usable after a rejected index.
  EXPECT_CLOSE(index_select(x, 0, tensor({4, 0}, kInt64).to(Device("cuda"))).cpu(),
               ref_index_select(x.cpu(), 0, tensor({4, 0}, kInt64)), 0.0);
}

}  // namespace
}  // namespace kiln::testing
