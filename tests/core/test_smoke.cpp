#include "support/testing.h"
TEST(Smoke, Builds) { EXPECT_EQ(kiln::zeros({2, 3}).numel(), 6); }
