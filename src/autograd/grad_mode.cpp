#include <atomic>

#include "kiln/autograd.h"

namespace kiln {
namespace {
thread_local bool tls_grad_enabled = true;
std::atomic<bool> g_deterministic{false};
}  // namespace

bool is_grad_enabled() { return tls_grad_enabled; }
void set_grad_enabled(bool enabled) { tls_grad_enabled = enabled; }
NoGradGuard::NoGradGuard() : previous_(tls_grad_enabled) { tls_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tls_grad_enabled = previous_; }

void use_deterministic_algorithms(bool enabled) { g_deterministic = enabled; }
bool are_deterministic_algorithms_enabled() { return g_deterministic; }

}  // namespace kiln
