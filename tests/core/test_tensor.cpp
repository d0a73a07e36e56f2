// Tensor core: geometry, views, copies and conversions, factories, printing, errors.
#include <cmath>
#include <cstring>

#include "support/testing.h"

using namespace kiln;

TEST(Dtype, SizesNamesPromotion) {
  EXPECT_EQ(element_size(kBFloat16), 2u);
  EXPECT_EQ(element_size(kInt64), 8u);
  EXPECT_STREQ(dtype_name(kFloat16), "float16");
  EXPECT_EQ(promote_types(kBFloat16, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kBFloat16, kFloat16), kFloat32);
  EXPECT_EQ(promote_types(kInt64, kBFloat16), kBFloat16);
  EXPECT_EQ(promote_types(kBool, kInt32), kInt32);
  EXPECT_EQ(promote_types(kInt32, kInt64), kInt64);
}

TEST(Dtype, HalfAndBFloat16RoundTrip) {
  // Every finite half converts to float and back unchanged; rounding is to nearest even.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if (((bits >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    const float f = Half::to_float(static_cast<uint16_t>(bits));
    ASSERT_EQ(Half::from_float(f), bits) << bits;
  }
  EXPECT_EQ(Half::from_float(65520.f), 0x7c00);  // rounds to inf
  EXPECT_EQ(static_cast<float>(Half(1.0f + 1.0f / 2048)), 1.0f);  // tie -> even
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(NAN))));
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 1.0f / 256)), 1.0f);  // tie -> even
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
}

TEST(Device, Parsing) {
  EXPECT_TRUE(Device("cpu").is_cpu());
  EXPECT_EQ(Device("cuda:3").index, 3);
  EXPECT_EQ(Device("cuda").str(), "cuda:0");
  EXPECT_THROW(Device("gpu"), Error);
  EXPECT_THROW(Device("cuda:x"), Error);
}

TEST(Tensor, GeometryAndFactories) {
  Tensor t = zeros({2, 3, 4});
  EXPECT_EQ(t.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  for (double v : t.to_vector()) EXPECT_EQ(v, 0.0);
  for (double v : full({5}, 2.5, kBFloat16).to_vector()) EXPECT_EQ(v, 2.5);
  const auto a = arange(0, 5, 1.5).to_vector();
  EXPECT_EQ(a, (std::vector<double>{0, 1.5, 3, 4.5}));
  EXPECT_EQ(arange(4, kInt64).dtype(), kInt64);
  EXPECT_EQ(scalar_tensor(3.0).dim(), 0);
  EXPECT_EQ(scalar_tensor(3.0).item(), 3.0);
  EXPECT_THROW(zeros({2, -1}), Error);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor base = arange(24, kFloat32).view({2, 3, 4});
  Tensor tr = base.transpose(0, 2);
  EXPECT_EQ(tr.sizes(), (Shape{4, 3, 2}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.select(0, 1).select(0, 2).select(0, 1).item(), base.select(0, 1).select(0, 2).select(0, 1).item());
  Tensor p = base.permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  Tensor s = base.slice(2, 1, 4, 2);  // columns 1 and 3
  EXPECT_EQ(s.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.contiguous().to_vector()[1], 3.0);
  Tensor n = base.narrow(1, 1, 2);
  EXPECT_EQ(n.select(0, 1).select(0, 0).select(0, 3).item(), base.select(0, 1).select(0, 1).select(0, 3).item());
  Tensor e = arange(3).view({3, 1}).expand({3, 4});
  EXPECT_EQ(e.strides()[1], 0);
  EXPECT_EQ(e.contiguous().to_vector()[5], 1.0);
  EXPECT_EQ(base.unsqueeze(1).sizes(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(base.unsqueeze(1).squeeze(1).sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(zeros({1, 3, 1}).squeeze().sizes(), (Shape{3}));
  EXPECT_EQ(base.flatten(1).sizes(), (Shape{2, 12}));
  EXPECT_EQ(base.view({-1, 4}).sizes(), (Shape{6, 4}));
  // A write through a view is visible in the base, and bumps the shared version.
  const uint64_t v0 = base.version();
  base.select(0, 1).fill_(7);
  EXPECT_EQ(base.to_vector()[12], 7.0);
  EXPECT_EQ(base.to_vector()[11], 11.0);
  EXPECT_GT(base.version(), v0);
}

TEST(Tensor, ViewAndReshapeRules) {
  Tensor t = randn({4, 6});
  EXPECT_THROW(t.t().view({24}), Error);  // incompatible strides: view refuses, reshape copies
  Tensor r = t.t().reshape({24});
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(r.to_vector()[1], t.to_vector()[6]);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  EXPECT_THROW(t.permute({0, 0}), Error);
  EXPECT_THROW(t.transpose(0, 2), Error);
  EXPECT_THROW(t.expand({3, 6}), Error);
  EXPECT_THROW(t.narrow(0, 3, 2), Error);
  try {
    t.view({7, -1});
    FAIL() << "view must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[view]"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ConversionsRoundTrip) {
  Tensor x = randn({3, 5}, kFloat64);
  EXPECT_LE(kiln::testing::rel_error(x.to(kFloat32), x), 1e-7);
  EXPECT_LE(kiln::testing::rel_error(x.to(kBFloat16), x), 4e-3);
  EXPECT_LE(kiln::testing::rel_error(x.to(kFloat16), x), 5e-4);
  Tensor i = randint(-50, 50, {7});
  EXPECT_EQ(i.to(kFloat32).to(kInt64).to_vector(), i.to_vector());
  Tensor b = tensor({0, 2, -1, 0}).to(kBool);
  EXPECT_EQ(b.to_vector(), (std::vector<double>{0, 1, 1, 0}));
  // copy_ broadcasts and converts into a strided destination
  Tensor dst = zeros({3, 4}, kBFloat16);
  dst.t().copy_(arange(3, kFloat64));  // dst.t()[i][j] = j, so row j of dst holds j
  EXPECT_EQ(dst.to_vector()[4], 1.0);
  EXPECT_EQ(dst.select(0, 2).to_vector(), (std::vector<double>{2, 2, 2, 2}));
  Tensor c = x.clone();
  EXPECT_FALSE(c.storage() == x.storage());
  EXPECT_EQ(c.to_vector(), x.to_vector());
}

TEST(Tensor, DenseBf16ConversionsMatchTheScalarRounding) {
  // Dense fp32 <-> bf16 copies take SIMD rows: every length's tail and every special value must give
  // BFloat16's own bits (ties to even, carries into the exponent, inf, quiet NaN, subnormals).
  std::vector<uint32_t> bits{0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                             0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x00000001u, 0x80007fffu,
                             0x00018000u, 0x80000000u, 0x477fe000u, 0xc0490fdbu};
  for (uint32_t s = 12345; bits.size() < 300;) bits.push_back(s = s * 1664525u + 1013904223u);
  std::vector<float> f(bits.size());
  std::memcpy(f.data(), bits.data(), bits.size() * 4);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{33}, static_cast<int64_t>(f.size())}) {
    const Tensor src = from_blob(f.data(), {n}, kFloat32);
    const Tensor b = src.to(kBFloat16), back = b.to(kFloat32);
    const auto* bp = static_cast<const uint16_t*>(b.data_ptr());
    const auto* fp = static_cast<const uint32_t*>(back.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bp[i], BFloat16::from_float(f[i])) << "element " << i << " of " << n << ": " << bits[i];
      ASSERT_EQ(fp[i], static_cast<uint32_t>(bp[i]) << 16) << "element " << i << " of " << n;
    }
  }
}

TEST(Tensor, FromBlobAndItem) {
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  bool freed = false;
  {
    Tensor t = from_blob(data.data(), {2, 3}, kFloat32, [&](void*) { freed = true; });
    EXPECT_EQ(t.select(1, 2).to_vector(), (std::vector<double>{3, 6}));
    Tensor col = from_blob(data.data(), {3}, kFloat32, nullptr, {2});
    EXPECT_EQ(col.to_vector(), (std::vector<double>{1, 3, 5}));
    EXPECT_THROW(t.item(), Error);
  }
  EXPECT_TRUE(freed);
}

TEST(Tensor, BoolBytesOtherThanZeroAndOneReadAsTrue) {
  // A checkpoint or a foreign buffer may hold any byte in a bool tensor (found by the fuzzer).
  std::vector<uint8_t> bytes{0, 1, 56, 255};
  Tensor b = from_blob(bytes.data(), {4}, kBool);
  EXPECT_EQ(b.to(kFloat32).to_vector(), (std::vector<double>{0, 1, 1, 1}));
}

TEST(Tensor, Printing) {
  const std::string s = tensor({1, 2.5}, kBFloat16).str();
  EXPECT_EQ(s, "tensor([1.0000, 2.5000], dtype=bfloat16)");
  EXPECT_EQ(arange(3, kInt64).view({1, 3}).str(), "tensor([[0, 1, 2]])");
  const std::string big = arange(10).str();
  EXPECT_NE(big.find("..."), std::string::npos) << big;
  EXPECT_NE(big.find("9.0000"), std::string::npos) << big;
}

TEST(Random, PhiloxReproducibleAndDistributed) {
  manual_seed(123);
  Tensor a = randn({10000});
  manual_seed(123);
  Tensor b = randn({10000});
  EXPECT_EQ(a.to_vector(), b.to_vector());
  Tensor c = randn({10000});  // the stream moves on
  EXPECT_NE(a.to_vector(), c.to_vector());
  auto v = a.to_vector();
  double mean = 0, var = 0;
  for (double x : v) mean += x;
  mean /= v.size();
  for (double x : v) var += (x - mean) * (x - mean);
  var /= v.size();
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.05);
  for (double x : rand({1000}).to_vector()) {
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
  }
  for (double x : randint(3, 9, {1000}).to_vector()) {
    EXPECT_GE(x, 3);
    EXPECT_LT(x, 9);
  }
  EXPECT_THROW(randint(5, 5, {2}), Error);
  EXPECT_THROW(randn({2}, kInt64), Error);
}

TEST(Memory, CpuStatsAreExact) {
  const Device cpu = kCPU;
  reset_peak_memory_stats(cpu);
  const int64_t before = memory_allocated(cpu);
  {
    Tensor t = empty({1000, 3}, kFloat32);  // 12000 bytes
    EXPECT_EQ(memory_allocated(cpu) - before, 12000);
    Tensor u = empty({10}, kBFloat16);  // 20 bytes
    EXPECT_EQ(memory_allocated(cpu) - before, 12020);
    Tensor v = t.transpose(0, 1);  // views allocate nothing
    EXPECT_EQ(memory_allocated(cpu) - before, 12020);
  }
  EXPECT_EQ(memory_allocated(cpu), before);
  EXPECT_EQ(max_memory_allocated(cpu) - before, 12020);
  reset_peak_memory_stats(cpu);
  EXPECT_EQ(max_memory_allocated(cpu), memory_allocated(cpu));
  EXPECT_GE(memory_reserved(cpu), memory_allocated(cpu));
}

TEST(Memory, CpuLargeBlocksAreCachedAndReleased) {
  const Device cpu = kCPU;
  empty_cache(cpu);
  const int64_t reserved0 = memory_reserved(cpu);
  const int64_t allocated0 = memory_allocated(cpu);
  { Tensor t = empty({3 << 20}, kFloat32); }  // 12 MiB: a large block, cached when freed
  const int64_t reserved1 = memory_reserved(cpu);
  EXPECT_GE(reserved1 - reserved0, 12 << 20);
  EXPECT_EQ(memory_allocated(cpu), allocated0);
  {
    Tensor u = empty({3 << 20}, kFloat32);  // same size: reuses the cached block
    EXPECT_EQ(memory_reserved(cpu), reserved1);
    EXPECT_EQ(memory_allocated(cpu) - allocated0, 12 << 20);
  }
  empty_cache(cpu);
  EXPECT_EQ(memory_reserved(cpu), reserved0);
}

// ---- CUDA ----

TEST(CudaTensor, RoundTripAndConversions) {
  KILN_REQUIRE_CUDA();
  Tensor x = randn({33, 65}, kFloat32);
  Tensor g = x.cuda();
  EXPECT_TRUE(g.is_cuda());
  EXPECT_EQ(g.cpu().to_vector(), x.to_vector());
  EXPECT_LE(kiln::testing::rel_error(g.to(kBFloat16).cpu(), x), 4e-3);
  // strided device copy with conversion
  Tensor t = g.t().contiguous();
  EXPECT_EQ(t.cpu().to_vector(), x.t().contiguous().to_vector());
  Tensor z = zeros({4, 5}, TensorOptions().device(Device("cuda")).dtype(kBFloat16));
  z.slice(1, 1, 3).fill_(3);
  EXPECT_EQ(z.cpu().select(0, 0).to_vector(), (std::vector<double>{0, 3, 3, 0, 0}));
  EXPECT_EQ(arange(5, Device("cuda")).cpu().to_vector(), arange(5).to_vector());
  EXPECT_NE(g.str().find("device='cuda:0'"), std::string::npos);
}

TEST(CudaTensor, RandomMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    manual_seed(7);
    Tensor a = randn({1001}, dt);
    Tensor u = rand({1001}, dt);
    Tensor i = randint(0, 1000, {1001});
    manual_seed(7);
    Tensor b = randn({1001}, TensorOptions().dtype(dt).device(Device("cuda")));
    Tensor v = rand({1001}, TensorOptions().dtype(dt).device(Device("cuda")));
    Tensor j = randint(0, 1000, {1001}, TensorOptions().dtype(kInt64).device(Device("cuda")));
    if (dt == kFloat64) {  // Box-Muller's log/sin/cos may differ by an ulp between libm and CUDA
      EXPECT_LE(kiln::testing::rel_error(b.cpu(), a), 1e-14);
    } else {  // rounded to float, the two backends agree bit for bit
      EXPECT_EQ(a.to_vector(), b.cpu().to_vector()) << dtype_name(dt);
    }
    EXPECT_EQ(u.to_vector(), v.cpu().to_vector()) << dtype_name(dt);
    EXPECT_EQ(i.to_vector(), j.cpu().to_vector());
  }
}

// Permuted copies: 16-byte packs where the innermost dim stays contiguous (heads moved next to
// tokens), the element kernel otherwise (odd inner size, a view at an odd offset, a transposed
// innermost dim, a dtype change); every result equals the CPU's bit for bit.
TEST(CudaTensor, PermutedCopiesMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kBFloat16, kFloat32, kFloat64})
    for (int64_t D : {64, 8, 3}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " D " + std::to_string(D));
      const Tensor x = randn({2, 5, 3, D}).to(dt);
      const Tensor g = x.cuda();
      EXPECT_EQ(g.transpose(1, 2).contiguous().cpu().to_vector(), x.transpose(1, 2).contiguous().to_vector());
      EXPECT_EQ(g.transpose(2, 3).contiguous().cpu().to_vector(), x.transpose(2, 3).contiguous().to_vector());
      EXPECT_EQ(g.narrow(3, 1, D - 1).contiguous().cpu().to_vector(), x.narrow(3, 1, D - 1).contiguous().to_vector());
      EXPECT_EQ(g.transpose(1, 2).to(kFloat32).cpu().to_vector(), x.transpose(1, 2).to(kFloat32).to_vector());
    }
}

TEST(CudaMemory, StatsAreExact) {
  KILN_REQUIRE_CUDA();
  const Device dev("cuda");
  cuda::synchronize();
  reset_peak_memory_stats(dev);
  const int64_t before = memory_allocated(dev);
  {
    Tensor t = empty({1 << 20}, TensorOptions().device(dev));  // 4 MiB
    EXPECT_EQ(memory_allocated(dev) - before, 4 << 20);
    EXPECT_GE(memory_reserved(dev), memory_allocated(dev));
  }
  EXPECT_EQ(memory_allocated(dev), before);
  EXPECT_EQ(max_memory_allocated(dev) - before, 4 << 20);
  reset_peak_memory_stats(dev);
  EXPECT_EQ(max_memory_allocated(dev), before);
}

TEST(CudaStream, EventsTimeWork) {
  KILN_REQUIRE_CUDA();
  cuda::Stream s = cuda::Stream::create(0);
  cuda::StreamGuard guard(s);
  EXPECT_EQ(cuda::current_stream().handle(), s.handle());
  cuda::Event start, stop;
  start.record();
  Tensor t = randn({1 << 22}, Device("cuda"));
  stop.record();
  stop.synchronize();
  EXPECT_GE(start.elapsed_ms(stop), 0.0f);
  EXPECT_EQ(t.cpu().numel(), 1 << 22);
}

TEST(NoCuda, ClearErrorWhenUnavailable) {
  if (kiln::testing::has_cuda()) GTEST_SKIP() << "CUDA present: the no-CUDA error path is not reachable";
  try {
    zeros({2}, Device("cuda"));
    FAIL() << "allocating on CUDA without CUDA must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}
