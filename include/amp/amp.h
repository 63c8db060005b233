// Umbrella header: every public header of amp::amp but three, which stay opt-in:
// <amp/ops.h> (the low-level fused ops), <amp/fp8.h> (float8 layers) and <amp/distributed.h>
// (the separate amp::distributed library). This comment is the one statement of what it holds.
#pragma once

#include <amp/archive.h>
#include <amp/autocast.h>
#include <amp/autocast_policy.h>
#include <amp/checkpoint.h>
#include <amp/custom_function.h>
#include <amp/export.h>
#include <amp/grad_scaler.h>
#include <amp/info.h>
#include <amp/low_precision.h>
#include <amp/optim.h>
#include <amp/scaler_hooks.h>
#include <amp/state_dict.h>
#include <amp/version.h>
