// The training examples' evaluation: the test accuracy of a classifier under the precision it
// was trained with.
#pragma once

#include <amp/autocast.h>
#include <amp/fp8.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>

#include "mnist_tensors.h"
#include "precision.h"

namespace amp_examples {

/// The fraction of `test` that `model` classifies correctly (the largest logit is the label), in
/// eval mode, without gradients, and under `precision`'s autocast on `device` (a disabled guard
/// for fp32) and float8 region, as training ran.
/// Args: model: a module holder whose forward maps a batch of images to logits; chunk: images per
///   forward pass, which only bounds memory.
template <class Model>
double test_accuracy(Model& model, const ImageSet& test, const Precision& precision,
                     c10::DeviceType device, std::int64_t chunk) {
  model->eval();
  at::NoGradGuard no_grad;
  amp::AutocastGuard autocast(device, precision.autocast_dtype,
                              precision.autocast_dtype.has_value());
  amp::fp8::Float8AutocastGuard float8(precision.float8);
  at::Tensor correct = at::zeros({}, test.labels.options());
  for (std::int64_t start = 0; start < test.size(); start += chunk) {
    const std::int64_t end = std::min(start + chunk, test.size());
    const at::Tensor predicted = model->forward(test.images.slice(0, start, end)).argmax(1);
    correct += predicted.eq(test.labels.slice(0, start, end)).sum();
  }
  return static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(test.size());
}

}  // namespace amp_examples
