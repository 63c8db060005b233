// custom_ops: amp with your own operators. A custom autograd Function that computes in float32
// through amp::custom_fwd/custom_bwd, and TORCH_LIBRARY operators given autocast policies with
// amp::autocast_kernel / amp::register_autocast. Prints the dtypes each one sees inside and
// outside autocast, checks them, and exits 1 if any differs from what amp promises.
#include <amp/autocast.h>
#include <amp/autocast_policy.h>
#include <amp/custom_function.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What the example's functions and kernels saw when they last ran, for the checks in main.
struct Observed {
  std::string forward_inputs;     ///< dtypes of FusedLinearGelu's forward inputs, inside fn
  bool forward_autocast = false;  ///< whether autocast was on inside forward
  bool backward_autocast = false;
  std::string backward_grad;  ///< dtype of the output gradient backward received
  std::string kernel_inputs;  ///< dtypes the last amp_example kernel received
};
Observed observed;

std::string dtypes(std::initializer_list<at::Tensor> tensors) {
  std::string text;
  for (const at::Tensor& tensor : tensors) {
    text += (text.empty() ? "" : ", ") + std::string(c10::toString(tensor.scalar_type()));
  }
  return text;
}

std::string on_off(bool enabled) { return enabled ? "autocast on" : "autocast off"; }

// ---- 1. A custom autograd Function: linear + GELU, always computed in float32 ----

/// gelu(x W^T + b) with a hand-written backward. custom_fwd's cast_inputs=Float makes both
/// passes run in float32 with autocast off even inside a bf16/fp16 region (where GELU's tail and
/// the bias add would lose precision), as Python's @custom_fwd(cast_inputs=torch.float32) does.
struct FusedLinearGelu : torch::autograd::Function<FusedLinearGelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, c10::DeviceType device) {
    ctx->saved_data["device"] = static_cast<std::int64_t>(device);
    return amp::custom_fwd(
        ctx, device, at::kFloat,
        [&](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
          observed.forward_inputs = dtypes({x, w, b});
          observed.forward_autocast = at::autocast::is_autocast_enabled(device);
          const at::Tensor pre_activation = at::addmm(b, x, w.t());
          ctx->save_for_backward({x, w, pre_activation});
          return at::gelu(pre_activation);
        },
        input, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto device = static_cast<c10::DeviceType>(ctx->saved_data["device"].toInt());
    // Runs with the autocast state forward recorded: off, since forward cast its inputs.
    return amp::custom_bwd(ctx, device, [&] {
      observed.backward_autocast = at::autocast::is_autocast_enabled(device);
      observed.backward_grad = dtypes({grads[0]});
      const variable_list saved = ctx->get_saved_variables();
      const at::Tensor grad_pre = at::gelu_backward(grads[0], saved[2]);
      // One gradient per forward argument; the device argument has none.
      return variable_list{grad_pre.mm(saved[1]), grad_pre.t().mm(saved[0]), grad_pre.sum(0),
                           at::Tensor()};
    });
  }
};

// ---- 2. Operators of our own, registered with the dispatcher ----

at::Tensor scaled_mm_kernel(const at::Tensor& a, const at::Tensor& b, double alpha) {
  observed.kernel_inputs = dtypes({a, b});
  return at::mm(a, b).mul_(alpha);
}

at::Tensor row_logsumexp_kernel(const at::Tensor& x) {
  observed.kernel_inputs = dtypes({x});
  return at::logsumexp(x, {1});
}

at::Tensor blend_kernel(const at::Tensor& a, const at::Tensor& b, double t) {
  observed.kernel_inputs = dtypes({a, b});
  // Type-promoting arithmetic (at::lerp would insist on equal dtypes outside autocast).
  return a.mul(1 - t).add(b, t);
}

TORCH_LIBRARY(amp_example, m) {
  m.def("scaled_mm(Tensor a, Tensor b, float alpha) -> Tensor");
  m.def("row_logsumexp(Tensor x) -> Tensor");
  m.def("blend(Tensor a, Tensor b, float t) -> Tensor");
}

// One kernel per op for every backend: they are written with ATen ops, which run anywhere.
TORCH_LIBRARY_IMPL(amp_example, CompositeExplicitAutograd, m) {
  m.impl("scaled_mm", &scaled_mm_kernel);
  m.impl("row_logsumexp", &row_logsumexp_kernel);
  m.impl("blend", &blend_kernel);
}

// Autocast policies fixed at build time, one block per device type's autocast key: a matmul is
// what lower precision is for; blending two tensors should not lose the wider one's precision.
TORCH_LIBRARY_IMPL(amp_example, AutocastCPU, m) {
  m.impl("scaled_mm",
         amp::autocast_kernel(c10::DeviceType::CPU, amp::AutocastPolicy::lower_precision));
  m.impl("blend", amp::autocast_kernel(c10::DeviceType::CPU, amp::AutocastPolicy::promote));
}
TORCH_LIBRARY_IMPL(amp_example, AutocastCUDA, m) {
  m.impl("scaled_mm",
         amp::autocast_kernel(c10::DeviceType::CUDA, amp::AutocastPolicy::lower_precision));
  m.impl("blend", amp::autocast_kernel(c10::DeviceType::CUDA, amp::AutocastPolicy::promote));
}

at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, double alpha) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("amp_example::scaled_mm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(a, b, alpha);
}

at::Tensor row_logsumexp(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("amp_example::row_logsumexp", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

at::Tensor blend(const at::Tensor& a, const at::Tensor& b, double t) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("amp_example::blend", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(a, b, t);
}

// ---- checks ----

/// Prints one observation per line, marked ok or WRONG, and counts the wrong ones.
class Checks {
 public:
  void expect(std::string_view what, const std::string& seen, const std::string& expected) {
    ++count_;
    if (seen == expected) {
      fmt::print("  ok     {}: {}\n", what, seen);
    } else {
      ++failed_;
      fmt::print("  WRONG  {}: {} (expected {})\n", what, seen, expected);
    }
  }
  int count() const { return count_; }
  int failed() const { return failed_; }

 private:
  int count_ = 0;
  int failed_ = 0;
};

/// Runs every check under autocast to `low` on `device`.
void check_device(c10::DeviceType device, c10::ScalarType low, Checks& checks) {
  const std::string low_name = c10::toString(low);
  const auto f32 = at::TensorOptions().device(device).dtype(at::kFloat);
  fmt::print("autocast to {} on {}:\n", low_name, c10::DeviceTypeName(device, /*lower_case=*/true));

  const at::Tensor input = at::randn({4, 8}, f32);
  const at::Tensor w0 = at::randn({8, 8}, f32).requires_grad_();
  const at::Tensor weight = at::randn({6, 8}, f32).requires_grad_();
  const at::Tensor bias = at::randn({6}, f32).requires_grad_();

  // The baseline: a built-in op on autocast's lower-precision list.
  checks.expect("at::linear outside autocast returns", dtypes({at::linear(input, w0)}), "Float");
  at::Tensor hidden, output;
  {
    amp::AutocastGuard autocast(device, low);
    hidden = at::linear(input, w0);
    checks.expect("at::linear inside autocast returns", dtypes({hidden}), low_name);
    hidden.retain_grad();
    output = FusedLinearGelu::apply(hidden, weight, bias, device);
    checks.expect("FusedLinearGelu inside autocast: forward computes in",
                  observed.forward_inputs + ", " + on_off(observed.forward_autocast),
                  "Float, Float, Float, autocast off");
    checks.expect("FusedLinearGelu inside autocast returns", dtypes({output}), "Float");
  }
  output.sum().backward();
  checks.expect("FusedLinearGelu backward receives and runs with",
                observed.backward_grad + ", " + on_off(observed.backward_autocast),
                "Float, autocast off");
  // The engine casts the float32 gradient back to the dtype of the input it belongs to.
  checks.expect("gradient reaching the autocast activation", dtypes({hidden.grad()}), low_name);
  checks.expect("gradient of the float32 weight", dtypes({weight.grad()}), "Float");

  const at::Tensor plain = FusedLinearGelu::apply(input, weight, bias, device);
  checks.expect("FusedLinearGelu outside autocast: forward computes in",
                observed.forward_inputs + ", " + on_off(observed.forward_autocast),
                "Float, Float, Float, autocast off");
  checks.expect("FusedLinearGelu outside autocast returns", dtypes({plain}), "Float");

  // The custom operators. Their inputs do not require grad: the example registers no autograd
  // formula for them.
  const at::Tensor a = at::randn({4, 8}, f32);
  const at::Tensor b = at::randn({8, 4}, f32);
  const at::Tensor low_a = a.to(low);
  const std::string both_low = low_name + ", " + low_name;
  scaled_mm(a, b, 0.5);
  checks.expect("amp_example::scaled_mm outside autocast: kernel receives", observed.kernel_inputs,
                "Float, Float");
  row_logsumexp(low_a);
  checks.expect("amp_example::row_logsumexp outside autocast: kernel receives",
                observed.kernel_inputs, low_name);
  blend(low_a, a, 0.25);
  checks.expect("amp_example::blend outside autocast: kernel receives", observed.kernel_inputs,
                low_name + ", Float");
  {
    amp::AutocastGuard autocast(device, low);
    const at::Tensor product = scaled_mm(a, b, 0.5);
    checks.expect("amp_example::scaled_mm (lower_precision) inside autocast: kernel receives",
                  observed.kernel_inputs, both_low);
    checks.expect("amp_example::scaled_mm inside autocast returns", dtypes({product}), low_name);
    const at::Tensor lse = row_logsumexp(low_a);
    checks.expect("amp_example::row_logsumexp (fp32) inside autocast: kernel receives",
                  observed.kernel_inputs, "Float");
    checks.expect("amp_example::row_logsumexp inside autocast returns", dtypes({lse}), "Float");
    blend(low_a, a, 0.25);
    checks.expect("amp_example::blend (promote) of " + low_name + " and Float: kernel receives",
                  observed.kernel_inputs, "Float, Float");
    blend(low_a, low_a, 0.25);
    checks.expect(
        "amp_example::blend (promote) of " + low_name + " and " + low_name + ": kernel receives",
        observed.kernel_inputs, both_low);
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  c10::DeviceType device = c10::DeviceType::CPU;
  amp_examples::CommandLine cli(
      "custom_ops",
      "Runs a custom autograd Function (amp::custom_fwd/custom_bwd) and custom TORCH_LIBRARY\n"
      "operators (autocast policies from amp::autocast_kernel / amp::register_autocast) inside\n"
      "and outside autocast regions, printing and checking the dtypes they see.");
  cli.add_option("device", "{cpu,cuda}", "where to run (default cpu)", [&](std::string_view value) {
    device = amp_examples::parse_choice("--device", value, {"cpu", "cuda"}) == 0
                 ? c10::DeviceType::CPU
                 : c10::DeviceType::CUDA;
  });
  try {
    if (!cli.parse(argc, argv)) {
      fmt::print("{}", cli.usage());
      return 0;
    }
  } catch (const amp_examples::UsageError& error) {
    fmt::print(stderr, "custom_ops: error: {}\n\n{}", error.what(), cli.usage());
    return amp_examples::kUsageExitCode;
  }
  if (device == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
    fmt::print(stderr,
               "custom_ops: error: --device cuda needs a CUDA GPU, but none is available (no GPU "
               "or driver on this machine, or a LibTorch built without CUDA); run on the CPU with "
               "--device cpu\n");
    return 1;
  }

  try {
    // A policy chosen at run time, for an operator some library has already defined.
    amp::register_autocast("amp_example::row_logsumexp", device, amp::AutocastPolicy::fp32);
    at::manual_seed(0);
    Checks checks;
    for (const c10::ScalarType low : {at::kBFloat16, at::kHalf}) check_device(device, low, checks);
    if (checks.failed() != 0) {
      fmt::print("{} of {} dtype checks failed\n", checks.failed(), checks.count());
      return 1;
    }
    fmt::print("all {} dtype checks passed\n", checks.count());
  } catch (const c10::Error& error) {
    fmt::print(stderr, "custom_ops: error: {}\n", error.what_without_backtrace());
    return 1;
  }
  return 0;
}
