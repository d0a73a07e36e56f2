// LinearCrossEntropyLoss refuses non-positive sizes with an error naming the class and the argument.
#include <string>

#include "kiln/lce.h"
#include "support/testing.h"

namespace kiln::nn {
namespace {

std::string error_of(int64_t in_features, int64_t num_classes) {
  try {
    LinearCrossEntropyLoss loss(in_features, num_classes);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LinearCrossEntropyModule, NonPositiveSizesNameTheArgument) {
  for (int64_t bad : {-8, 0}) {
    const std::string in = error_of(bad, 10), classes = error_of(10, bad);
    EXPECT_NE(in.find("[LinearCrossEntropyLoss]"), std::string::npos) << in;
    EXPECT_NE(in.find("in_features must be a positive integer, got " + std::to_string(bad)), std::string::npos) << in;
    EXPECT_NE(classes.find("[LinearCrossEntropyLoss]"), std::string::npos) << classes;
    EXPECT_NE(classes.find("num_classes must be a positive integer, got " + std::to_string(bad)), std::string::npos)
        << classes;
  }
  const LinearCrossEntropyLoss ok(8, 10);
  EXPECT_EQ(ok.weight().sizes(), (Shape{10, 8}));
}

}  // namespace
}  // namespace kiln::nn
