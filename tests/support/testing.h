#pragma once
// Shared test helpers: relative error against float64 references, tolerances by dtype,
// finite-difference gradient checks, and the CPU-vs-CUDA harness.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::testing {

// The command-line arguments after GoogleTest's own flags (tests/support/test_main.cpp), e.g. the
// paths a re-executed test binary is given: `test_train --gtest_filter=TrainChild.Run RUN DATA`.
const std::vector<std::string>& program_args();

// The command that starts this test binary again: {"/proc/self/exe"}, or, in a cross build whose
// tests run under an emulator (qemu-aarch64), the emulator's command followed by this binary's
// path, so a child process runs without the host kernel knowing the binary's architecture.
std::vector<std::string> self_command();

// ||out - ref|| / ||ref|| in float64 over all elements; +inf if any NaN/inf appears in out
// where ref is finite, or if shapes differ.
double rel_error(const Tensor& out, const Tensor& ref);
// Largest acceptable rel_error for results computed in `dtype` (fp32 1e-5, bf16 1e-2, ...).
double tolerance(DType dtype);

// True when a CUDA device can run kernels here.
bool has_cuda();

// Central finite differences in float64 against autograd, for every input that requires grad.
// f maps the inputs to one output tensor; a random cotangent projects it to a scalar.
void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                      double eps = 1e-6, double tol = 1e-6);

// Runs f on `inputs` (CPU) and on their CUDA copies, compares outputs and input gradients.
// tol defaults to the output dtype's tolerance.
void expect_cuda_matches_cpu(const std::string& name, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs, double tol = -1);

}  // namespace kiln::testing

#define EXPECT_CLOSE(out, ref, tol)                                                        \
  do {                                                                                     \
    const double kiln_err_ = ::kiln::testing::rel_error((out), (ref));                     \
    EXPECT_LE(kiln_err_, (tol)) << "relative error " << kiln_err_ << " > " << (tol);       \
  } while (0)

// CUDA tests skip with a message where there is no GPU (CI); they never pass silently.
#define KILN_REQUIRE_CUDA()                                                                \
  do {                                                                                     \
    if (!::kiln::testing::has_cuda()) GTEST_SKIP() << "no CUDA device available: CUDA test skipped"; \
  } while (0)
