// A C++ user of an installed kiln: find_package(kiln) + kiln::kiln (run by the install test).
#include <kiln/kiln.h>
#include <iostream>
int main() {
  using namespace kiln;
  Tensor w = randn({4, 3}).requires_grad_();
  Tensor loss = sum(linear(randn({2, 3}), w));
  loss.backward();
  std::cout << w.grad().sizes() << " " << memory_allocated(kCPU) << "\n";
}
