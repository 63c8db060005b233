// amp::optim: optimizers for LibTorch that implement GradScaler's scaling protocol (a step with
// no host sync) and keep the updates of bfloat16/float16 weights. One header per family:
// FusedAdam and FusedAdamW (amp/optim/adam.h), FusedSGD (amp/optim/sgd.h) over ATen's fused
// kernels, and FusedLion (amp/optim/lion.h) on amp's step engine. Adam and AdamW
// (amp/optim/unfused_adam.h) are LibTorch's with Python's unfused arithmetic, for runs that move
// between the languages.
#pragma once

#include <amp/optim/adam.h>
#include <amp/optim/lion.h>
#include <amp/optim/sgd.h>
#include <amp/optim/unfused_adam.h>
