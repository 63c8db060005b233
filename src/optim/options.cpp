// The fused optimizers' options and per-parameter state: constructors and archive entries in
// LibTorch's layout (AdamOptions/AdamWOptions/SGDOptions, AdamParamState/SGDParamState).
#include <amp/optim.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "optim/fused_step.h"

namespace amp::optim {

namespace {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

std::tuple<double, double> read_betas(InputArchive& archive) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read("betas", value), "the entry \"betas\" is missing");
  std::vector<c10::IValue> items;
  if (value.isTuple()) {
    items = value.toTupleRef().elements().vec();
  } else if (value.isList()) {
    items = value.toListRef().vec();
  }
  TORCH_CHECK(items.size() == 2 && items[0].isDouble() && items[1].isDouble(),
              "the entry \"betas\" is not a pair of floats");
  return {items[0].toDouble(), items[1].toDouble()};
}

template <typename AdamOptions>
void write_adam_options(const AdamOptions& options, OutputArchive& archive) {
  // LibTorch's AdamOptions entries first, so torch::optim::Adam/AdamW can read them.
  archive.write("lr", c10::IValue(options.lr()));
  archive.write("betas", c10::IValue(options.betas()));
  archive.write("eps", c10::IValue(options.eps()));
  archive.write("weight_decay", c10::IValue(options.weight_decay()));
  archive.write("amsgrad", c10::IValue(options.amsgrad()));
  archive.write("maximize", c10::IValue(options.maximize()));
  archive.write("capturable", c10::IValue(options.capturable()));
}

template <typename AdamOptions>
void read_adam_options(AdamOptions& options, InputArchive& archive) {
  using detail::read_bool;
  using detail::read_double;
  options.lr(read_double(archive, "lr", true, 0.0))
      .betas(read_betas(archive))
      .eps(read_double(archive, "eps", true, 0.0))
      .weight_decay(read_double(archive, "weight_decay", true, 0.0))
      .amsgrad(read_bool(archive, "amsgrad", true, false))
      // Absent from LibTorch's checkpoints.
      .maximize(read_bool(archive, "maximize", false, false))
      .capturable(read_bool(archive, "capturable", false, false));
}

void write_tensor(OutputArchive& archive, const char* key, const at::Tensor& tensor) {
  // As LibTorch: an undefined tensor is not written (Python omits the key).
  if (tensor.defined()) archive.write(key, c10::IValue(tensor));
}

}  // namespace

FusedAdamOptions::FusedAdamOptions(double lr) : lr_(lr) {}
FusedAdamWOptions::FusedAdamWOptions(double lr) : lr_(lr) {}
FusedSGDOptions::FusedSGDOptions(double lr) : lr_(lr) {}

void FusedAdamOptions::serialize(OutputArchive& archive) const {
  write_adam_options(*this, archive);
}
void FusedAdamOptions::serialize(InputArchive& archive) { read_adam_options(*this, archive); }
void FusedAdamWOptions::serialize(OutputArchive& archive) const {
  write_adam_options(*this, archive);
}
void FusedAdamWOptions::serialize(InputArchive& archive) { read_adam_options(*this, archive); }

void FusedSGDOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("momentum", c10::IValue(momentum()));
  archive.write("dampening", c10::IValue(dampening()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("nesterov", c10::IValue(nesterov()));
  archive.write("maximize", c10::IValue(maximize()));
  archive.write("capturable", c10::IValue(capturable()));
}

void FusedSGDOptions::serialize(InputArchive& archive) {
  using detail::read_bool;
  using detail::read_double;
  lr(read_double(archive, "lr", true, 0.0))
      .momentum(read_double(archive, "momentum", true, 0.0))
      .dampening(read_double(archive, "dampening", true, 0.0))
      .weight_decay(read_double(archive, "weight_decay", true, 0.0))
      .nesterov(read_bool(archive, "nesterov", true, false))
      .maximize(read_bool(archive, "maximize", false, false))
      .capturable(read_bool(archive, "capturable", false, false));
}

void FusedAdamParamState::serialize(OutputArchive& archive) const {
  // LibTorch's AdamParamState keeps the count as an int64: written that way, each library reads
  // the other's checkpoints. The count is exact in float32 up to 2^24 steps.
  archive.write("step", c10::IValue(step().defined() ? static_cast<int64_t>(step().item<float>())
                                                     : int64_t{0}));
  write_tensor(archive, "exp_avg", exp_avg());
  write_tensor(archive, "exp_avg_sq", exp_avg_sq());
  write_tensor(archive, "max_exp_avg_sq", max_exp_avg_sq());
}

void FusedAdamParamState::serialize(InputArchive& archive) {
  c10::IValue count;
  TORCH_CHECK(archive.try_read("step", count), "a state entry has no \"step\"");
  if (count.isInt()) {
    TORCH_CHECK(count.toInt() >= 0 && count.toInt() <= (int64_t{1} << 24),
                "a state entry's step count ", count.toInt(), " is outside [0, 2^24]");
    step(at::full({}, static_cast<double>(count.toInt()), at::kFloat));
  } else {
    TORCH_CHECK(count.isTensor() && count.toTensor().numel() == 1,
                "a state entry's \"step\" is neither an integer nor a 1-element tensor");
    step(count.toTensor().reshape(at::IntArrayRef{}).to(at::kFloat));
  }
  exp_avg(detail::read_tensor(archive, "exp_avg"));
  exp_avg_sq(detail::read_tensor(archive, "exp_avg_sq"));
  max_exp_avg_sq(detail::read_tensor(archive, "max_exp_avg_sq"));
}

void FusedSGDParamState::serialize(OutputArchive& archive) const {
  write_tensor(archive, "momentum_buffer", momentum_buffer());
}

void FusedSGDParamState::serialize(InputArchive& archive) {
  momentum_buffer(detail::read_tensor(archive, "momentum_buffer"));
}

}  // namespace amp::optim
