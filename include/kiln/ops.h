#pragma once
// Every op family.
#include "kiln/ops/elementwise.h"
#include "kiln/ops/indexing.h"
#include "kiln/ops/inplace.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/masking.h"
#include "kiln/ops/nn_functional.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape_ops.h"
#include "kiln/ops/statistics.h"
