#pragma once
// Everything a kiln user needs.
#include "kiln/autograd.h"
#include "kiln/cuda.h"
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/flex.h"
#include "kiln/io.h"
#include "kiln/memory.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/optim.h"
#include "kiln/tensor.h"
