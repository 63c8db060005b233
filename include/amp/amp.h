// Umbrella header: what a training loop needs (autocast, custom functions, GradScaler, fused
// optimizers). The low-level fused ops stay opt-in: include <amp/ops.h> for them.
#pragma once

#include <amp/archive.h>
#include <amp/autocast.h>
#include <amp/autocast_policy.h>
#include <amp/custom_function.h>
#include <amp/export.h>
#include <amp/grad_scaler.h>
#include <amp/info.h>
#include <amp/low_precision.h>
#include <amp/optim.h>
#include <amp/version.h>
