// The examples' reports: the loss-scale note of each epoch line, read from a GradScaler's counters.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>

#include <amp/grad_scaler.h>

#include "common/train_monitor.h"

namespace {

// One optimizer step of `scaler` on a parameter whose gradient is `grad`.
void step(amp::GradScaler& scaler, torch::optim::SGD& optimizer, torch::Tensor& parameter,
          float grad) {
  optimizer.zero_grad();
  (void)scaler.scale(torch::ones({}));
  parameter.mutable_grad() = torch::full({2}, grad);
  scaler.step(optimizer);
  scaler.update();
}

}  // namespace

TEST_CASE("The epoch note gives the loss scale and the steps skipped during the epoch",
          "[examples]") {
  torch::Tensor parameter = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD optimizer({parameter}, torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().track_counters(true).growth_interval(2));
  amp_examples::LossScaleNote note(scaler);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // torch.amp's rule (the scales below are what torch.amp.GradScaler("cpu", growth_interval=2)
  // reports for the same steps): an overflow skips the step and halves the scale (2^16 -> 2^15);
  // two clean steps in a row (the growth interval here) double it again.
  step(scaler, optimizer, parameter, kInf);
  step(scaler, optimizer, parameter, 1.0F);
  step(scaler, optimizer, parameter, 1.0F);
  CHECK(note.next(scaler, 3) == ", loss scale 65536, skipped steps 1 of 3");
  // The count starts afresh each epoch.
  step(scaler, optimizer, parameter, 1.0F);
  CHECK(note.next(scaler, 1) == ", loss scale 65536, skipped steps 0 of 1");
  step(scaler, optimizer, parameter, kInf);
  step(scaler, optimizer, parameter, kInf);
  CHECK(note.next(scaler, 2) == ", loss scale 16384, skipped steps 2 of 2");
  // A note started on a scaler that has already skipped steps counts only the new ones.
  amp_examples::LossScaleNote resumed(scaler);
  step(scaler, optimizer, parameter, 1.0F);
  CHECK(resumed.next(scaler, 1) == ", loss scale 16384, skipped steps 0 of 1");
}

TEST_CASE("Without loss scaling the epoch note is empty", "[examples]") {
  amp::GradScaler scaler(c10::DeviceType::CPU,
                         amp::GradScalerOptions().track_counters(true).enabled(false));
  amp_examples::LossScaleNote note(scaler);
  CHECK(note.next(scaler, 938).empty());
  CHECK(amp_examples::read_scaler(scaler).scale == 1.0);
  CHECK(amp_examples::read_scaler(scaler).steps == 0);
}
