// nn::functional::embedding: forward against a plain row lookup, backward against a float64
// accumulation of rows, gradcheck, CPU-vs-CUDA, bitwise run-to-run determinism of the CUDA
// backward at LM-like shapes, and errors.
#include <cstring>

#include "indexing_test_util.h"

namespace kiln::testing {
namespace {

using idx::expect_error;
using idx::from_values;
namespace F = nn::functional;

Tensor ref_embedding(const Tensor& indices, const Tensor& weight) {
  const std::vector<double> iv = indices.to_vector(), wv = weight.to_vector();
  const int64_t dim = weight.size(1);
  std::vector<double> out;
  for (double i : iv)
    for (int64_t c = 0; c < dim; ++c) out.push_back(wv[static_cast<int64_t>(i) * dim + c]);
  Shape shape = indices.sizes();
  shape.push_back(dim);
  return from_values(out, shape);
}

Tensor ref_embedding_grad(const Tensor& indices, const Tensor& g, int64_t num_embeddings) {
  const std::vector<double> iv = indices.to_vector(), gv = g.to_vector();
  const int64_t dim = g.size(-1);
  std::vector<double> out(static_cast<size_t>(num_embeddings * dim), 0.0);
  for (size_t t = 0; t < iv.size(); ++t)
    for (int64_t c = 0; c < dim; ++c) out[static_cast<int64_t>(iv[t]) * dim + c] += gv[t * dim + c];
  return from_values(out, {num_embeddings, dim});
}

TEST(Embedding, ForwardBackwardMatchReference) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    for (DType it : {kInt64, kInt32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " / " + dtype_name(it));
      const Tensor weight = randn({37, 24}).to(dt).requires_grad_();
      const Tensor indices = randint(0, 37, {4, 50}, it);  // 200 tokens over 37 rows: repeats
      const Tensor out = F::embedding(indices, weight);
      ASSERT_EQ(out.sizes(), (Shape{4, 50, 24}));
      EXPECT_CLOSE(out, ref_embedding(indices, weight), 0.0);
      const Tensor g = randn(out.sizes()).to(dt);
      out.backward(g);
      EXPECT_CLOSE(weight.grad(), ref_embedding_grad(indices, g, 37), tolerance(dt));
    }
  }
}

TEST(Embedding, StridedWeightAndIndices) {
  const Tensor base = randn({16, 40});
  const Tensor weight = base.t().detach().requires_grad_();  // [40, 16], non-contiguous
  const Tensor indices = randint(0, 40, {30, 6}).t();         // [6, 30], non-contiguous
  const Tensor out = F::embedding(indices, weight);
  EXPECT_CLOSE(out, ref_embedding(indices, weight), 0.0);
  const Tensor g = randn(out.sizes());
  out.backward(g);
  EXPECT_CLOSE(weight.grad(), ref_embedding_grad(indices.contiguous(), g, 40), 1e-6);
}

TEST(Embedding, Gradcheck) {
  const Tensor weight = randn({6, 3}, kFloat64).requires_grad_();
  const Tensor indices = randint(0, 6, {2, 5}, kInt32);
  expect_gradcheck([&](const std::vector<Tensor>& in) { return F::embedding(indices, in[0]); }, {weight});
  // 0-d indices give a [dim] row.
  const Tensor one = randint(0, 6, {}, kInt64);
  EXPECT_EQ(F::embedding(one, weight.detach()).sizes(), (Shape{3}));
}

TEST(Embedding, Errors) {
  const Tensor weight = randn({10, 4});
  expect_error([&] { F::embedding(tensor({3, 10}, kInt64), weight); },
               {"[embedding]", "index 10", "position 1", "[0, 10)"});
  expect_error([&] { F::embedding(tensor({-1}, kInt32), weight); }, {"[embedding]", "index -1"});
  expect_error([&] { F::embedding(tensor({1}, kFloat32), weight); }, {"[embedding]", "int64 or int32"});
  expect_error([&] { F::embedding(tensor({1}, kInt64), randn({10})); }, {"[embedding]", "[num_embeddings, dim]"});
}

TEST(EmbeddingCuda, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    for (DType it : {kInt64, kInt32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " / " + dtype_name(it));
      // dim 768: the 16-byte vector path; dim 10: the scalar fallback.
      for (int64_t dim : {768, 10}) {
        const Tensor weight = randn({300, dim}).to(dt).requires_grad_();
        const Tensor indices = randint(0, 300, {4, 256}, it);
        expect_cuda_matches_cpu(
            "embedding", [](const std::vector<Tensor>& in) { return F::embedding(in[1], in[0]); }, {weight, indices});
      }
    }
  }
}

TEST(EmbeddingCuda, LmShapeBackwardIsBitwiseDeterministic) {
  KILN_REQUIRE_CUDA();
  // GPT-2-like: vocab 50257, dim 768, 8192 tokens, with a skewed distribution (many repeats).
  const Device cuda("cuda");
  const Tensor common = randint(0, 64, {4096});
  const Tensor rare = randint(0, 50257, {4096});
  const Tensor indices = cat({common, rare}, 0).reshape({8, 1024}).to(cuda);
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const TensorOptions opts = TensorOptions().device(cuda).dtype(dt);
    const Tensor g = randn({8, 1024, 768}, opts);
    const Tensor weight = randn({50257, 768}, opts).requires_grad_();
    Tensor first;
    for (int r = 0; r < 3; ++r) {
      weight.set_grad(Tensor());
      F::embedding(indices, weight).backward(g);
      const Tensor grad = weight.grad().cpu();
      if (r == 0) {
        first = grad;
        continue;
      }
      EXPECT_EQ(std::memcmp(first.data_ptr(), grad.data_ptr(), first.nbytes()), 0)
          << "embedding backward differs bitwise between runs";
    }
    EXPECT_CLOSE(first, ref_embedding_grad(indices.cpu(), g.cpu(), 50257), tolerance(dt));
  }
}

TEST(EmbeddingCuda, Errors) {
  KILN_REQUIRE_CUDA();
  const Tensor weight = randn({10, 4}).to(Device("cuda"));
  expect_error([&] { F::embedding(tensor({2, 3, 11}, kInt64).to(Device("cuda")), weight); },
               {"[embedding]", "index 11", "position 2"});
  expect_error([&] { F::embedding(tensor({2}, kInt64), weight); }, {"[embedding]", "indices", "cpu"});
}

}  // namespace
}  // namespace kiln::testing
