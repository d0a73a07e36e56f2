// Non-empty and partial BlockMask blocks of the training benchmark's mask (causal & same document,
// B = 4, T = 4096) for documents of random lengths (uniform 1-2047, the synthetic data) and for 4
// equal documents, at 128- and 64-token blocks. Build:
//   g++ -std=c++20 -O1 -Iinclude -Isrc dev/flex_block_counts.cpp build/libkiln.a -o /tmp/flex_block_counts \
//     -L/usr/local/cuda/lib64 -lhwy -lnvrtc -lcudart -lcublasLt -lcublas -lopenblas -fopenmp -lpthread -ldl
#include <cstdio>
#include <random>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;

static void count(const char* name, const std::vector<std::vector<int>>& docs, int64_t block) {
  const int64_t B = static_cast<int64_t>(docs.size()), T = static_cast<int64_t>(docs[0].size());
  std::vector<double> flat;
  for (const auto& d : docs)
    for (int v : d) flat.push_back(v);
  const Tensor ids = tensor(flat, kInt32).reshape({B, T});
  const flex::Captured c = flex::capture(ids);
  const flex::MaskMod same([&](flex::Expr b, flex::Expr, flex::Expr q, flex::Expr kv) { return c[b][q] == c[b][kv]; });
  const flex::BlockMask m = flex::create_block_mask(flex::and_masks({flex::causal_mask(), same}), B, 1, T, T, block);
  const double partial = sum(m.kv_num_blocks.to(kFloat64)).item(), full = sum(m.full_kv_num_blocks.to(kFloat64)).item();
  std::printf("block %lld, %s: %.0f non-empty (%.0f partial, %.0f%%), %.2f M elements computed\n",
              static_cast<long long>(block), name, partial + full, partial, 100 * partial / (partial + full),
              (partial + full) * static_cast<double>(block * block) / 1e6);
}

int main() {
  std::mt19937_64 gen(7);
  std::uniform_int_distribution<int> length(1, 2047);
  std::vector<std::vector<int>> random_docs(4, std::vector<int>(4096)), equal_docs(4, std::vector<int>(4096));
  for (int b = 0; b < 4; ++b) {
    int doc = 0, left = length(gen);
    for (int t = 0; t < 4096; ++t) {
      if (left-- == 0) {
        ++doc;
        left = length(gen) - 1;
      }
      random_docs[b][t] = doc;
      equal_docs[b][t] = t / 1024;
    }
  }
  for (int64_t block : {128, 64}) {
    count("random lengths", random_docs, block);
    count("4 equal documents", equal_docs, block);
  }
}
