// Umbrella header: everything public in amp.
#pragma once

#include <amp/version.h>
#include <amp/export.h>
#include <amp/info.h>
#include <amp/autocast.h>
#include <amp/autocast_policy.h>
#include <amp/custom_function.h>
#include <amp/grad_scaler.h>
#include <amp/ops.h>
