// The fused optimizers' archive entries (save/load): numbers, flags and tensors in LibTorch's
// layout.
#include "optim/archive_io.h"

#include <optional>

#include <ATen/ATen.h>

namespace amp::optim::detail {

namespace {

// The entry under `key`, or nullopt when it is absent and not `required`.
std::optional<c10::IValue> find_entry(torch::serialize::InputArchive& archive, const char* key,
                                      bool required) {
  c10::IValue value;
  if (archive.try_read(key, value)) return value;
  TORCH_CHECK(!required, "the entry \"", key, "\" is missing");
  return std::nullopt;
}

}  // namespace

double read_double(torch::serialize::InputArchive& archive, const char* key, bool required,
                   double fallback) {
  const auto value = find_entry(archive, key, required);
  if (!value) return fallback;
  TORCH_CHECK(value->isDouble() || value->isInt(), "the entry \"", key, "\" is a ",
              value->tagKind(), ", not a number");
  return value->isDouble() ? value->toDouble() : static_cast<double>(value->toInt());
}

bool read_bool(torch::serialize::InputArchive& archive, const char* key, bool required,
               bool fallback) {
  const auto value = find_entry(archive, key, required);
  if (!value) return fallback;
  TORCH_CHECK(value->isBool(), "the entry \"", key, "\" is a ", value->tagKind(), ", not a bool");
  return value->toBool();
}

int64_t read_int(torch::serialize::InputArchive& archive, const char* key, bool required,
                 int64_t fallback) {
  const auto value = find_entry(archive, key, required);
  if (!value) return fallback;
  TORCH_CHECK(value->isInt(), "the entry \"", key, "\" is a ", value->tagKind(),
              ", not an integer");
  return value->toInt();
}

std::tuple<double, double> read_betas(torch::serialize::InputArchive& archive) {
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

at::Tensor read_tensor(torch::serialize::InputArchive& archive, const char* key) {
  const auto value = find_entry(archive, key, /*required=*/false);
  if (!value) return at::Tensor();
  TORCH_CHECK(value->isTensor(), "the entry \"", key, "\" is a ", value->tagKind(),
              ", not a tensor");
  return value->toTensor();
}

void write_tensor(torch::serialize::OutputArchive& archive, const char* key,
                  const at::Tensor& tensor) {
  if (tensor.defined()) archive.write(key, c10::IValue(tensor));
}

bool same_tensor(const at::Tensor& lhs, const at::Tensor& rhs) {
  if (!lhs.defined() || !rhs.defined()) return lhs.defined() == rhs.defined();
  return lhs.scalar_type() == rhs.scalar_type() && lhs.device() == rhs.device() &&
         lhs.sizes() == rhs.sizes() && at::equal(lhs, rhs);
}

void write_step_count(torch::serialize::OutputArchive& archive, const at::Tensor& step) {
  archive.write(
      "step", c10::IValue(step.defined() ? static_cast<int64_t>(step.item<float>()) : int64_t{0}));
}

at::Tensor read_step_count(torch::serialize::InputArchive& archive) {
  c10::IValue count;
  TORCH_CHECK(archive.try_read("step", count), "a state entry has no \"step\"");
  if (count.isInt()) {
    TORCH_CHECK(count.toInt() >= 0 && count.toInt() <= (int64_t{1} << 24),
                "a state entry's step count ", count.toInt(), " is outside [0, 2^24]");
    return at::full({}, static_cast<double>(count.toInt()), at::kFloat);
  }
  TORCH_CHECK(count.isTensor() && count.toTensor().numel() == 1,
              "a state entry's \"step\" is neither an integer nor a 1-element tensor");
  return count.toTensor().reshape(at::IntArrayRef{}).to(at::kFloat);
}

}  // namespace amp::optim::detail
