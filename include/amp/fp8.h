// amp::fp8: float8 training for LibTorch modules. Float8Linear computes the three GEMMs of a
// linear layer (output, grad_input, grad_weight) in float8 through at::_scaled_mm, with torchao's
// dynamic recipes (tensorwise, rowwise, rowwise_with_gw_hp; the same bits as torchao 0.18 on the
// CPU) or Transformer Engine's delayed scaling (amax histories in module buffers).
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <amp/detail/buffer_roles.h>
#include <amp/export.h>

namespace amp::fp8 {

/// How many values one scale covers.
enum class Granularity {
  /// One scale for the whole tensor (torchao's TENSORWISE).
  tensorwise,
  /// One scale per row along the GEMM's reduction dimension (torchao's AXISWISE).
  rowwise,
};

/// How one operand of one of the three GEMMs is cast to float8.
struct AMP_EXPORT CastConfig {
  /// false leaves the operand in high precision (torchao's ScalingType.DISABLED); both operands
  /// of a GEMM are then high precision and the GEMM is an ordinary mm.
  bool enabled = true;
  /// One scale for the tensor, or one per row along the GEMM's reduction dimension.
  Granularity granularity = Granularity::tensorwise;
  /// Float8_e4m3fn or Float8_e5m2.
  c10::ScalarType dtype = c10::ScalarType::Float8_e4m3fn;

  /// Field-wise equality (two casts of one tensor with equal configs give the same bits).
  bool operator==(const CastConfig&) const = default;
};

/// How the delayed recipe turns an amax history into a scale (Transformer Engine's names).
enum class AmaxComputeAlgo {
  /// The largest amax in the history.
  max,
  /// The amax of the latest cast.
  most_recent,
};

/// Which float8 formats the delayed recipe uses (Transformer Engine's Format).
enum class Float8Format {
  /// e4m3 everywhere.
  e4m3,
  /// e4m3 for the forward's input and weight, e5m2 for the backward's grad_output.
  hybrid,
};

/// Reduces one amax in place across the processes of a data-parallel job (maximum), so that every
/// rank derives the same scale. amp::distributed::amax_all_reduce(group) gives one over c10d that
/// batches: its casts wait, and one collective per group reduces all of them (see
/// flush_delayed_scaling). A function of your own is called once per cast.
using AmaxReduction = std::function<void(const at::Tensor& amax)>;

/// Transformer Engine's DelayedScaling: each cast uses a scale derived from the amaxes of earlier
/// casts of the same tensor. Per layer and operand (input, weight, grad_output) a history of
/// `amax_history_len` amaxes and a scale live in module buffers. At every cast, in this order:
/// the tensor is quantised with the current scale; its amax goes to history[0] (reduced across
/// ranks first when `amax_reduction` is set); amax = max(history) or history[0]; the history rolls
/// by one (torch.roll(history, -1)) and history[0] becomes 0; scale = (fp8_max / amax) / 2^margin,
/// except that the scale is kept when amax is 0, inf or NaN, and an infinite scale becomes
/// FLT_MAX. The first cast of a fresh layer uses scale 1. With a batched `amax_reduction`
/// (amp::distributed::amax_all_reduce) the amax waits in history[0] and the rest of the update
/// runs at the next flush (flush_delayed_scaling), which gives the same bits.
struct AMP_EXPORT DelayedScalingOptions {
  /// How many earlier amaxes each operand remembers (at least 1).
  TORCH_ARG(int64_t, amax_history_len) = 1024;
  /// Whether the scale follows the history's largest amax or the latest one.
  TORCH_ARG(AmaxComputeAlgo, amax_compute_algo) = AmaxComputeAlgo::max;
  /// Scales are divided by 2^margin: headroom for amaxes that grow between casts.
  TORCH_ARG(int64_t, margin) = 0;
  /// e4m3 everywhere, or e5m2 for grad_output (hybrid).
  TORCH_ARG(Float8Format, fp8_format) = Float8Format::hybrid;
  /// Unset: every rank keeps its own amaxes, histories and scales (DistributedDataParallel does
  /// not broadcast these buffers), as with Transformer Engine without an amax reduction group.
  TORCH_ARG(AmaxReduction, amax_reduction) = nullptr;
};

/// A float8 training recipe: how each operand of the three GEMMs of a linear layer is cast.
/// Build one with a named constructor; the fields are public so that a recipe can be inspected
/// or adjusted (validate() is called when a layer is built).
struct AMP_EXPORT Recipe {
  /// torchao's default: dynamic tensorwise scales, e4m3 input and weight, e5m2 grad_output,
  /// fast accumulation in the output GEMM.
  static Recipe tensorwise();
  /// torchao's ROWWISE: dynamic rowwise scales rounded down to powers of two, e4m3 everywhere.
  static Recipe rowwise();
  /// torchao's ROWWISE_WITH_GW_HP: as rowwise, but the weight is cast tensorwise for grad_input
  /// and grad_weight is computed in high precision.
  static Recipe rowwise_with_gw_hp();
  /// Transformer Engine's delayed scaling (tensorwise scales from amax histories).
  static Recipe delayed(DelayedScalingOptions options = {});
  /// "tensorwise", "rowwise", "rowwise_with_gw_hp" or "delayed" (default options). Throws
  /// c10::Error naming the valid names for another.
  static Recipe from_name(const std::string& name);
  /// The names from_name() accepts, in that order: the one list of them (programs build their
  /// command-line choices from it).
  static const std::vector<std::string>& names();

  /// One of the names from_name() accepts.
  std::string name;
  /// The input's cast for the output GEMM (input @ weight.t()).
  CastConfig input;
  /// The weight's cast for the output GEMM.
  CastConfig weight;
  /// grad_output's cast for the grad_input GEMM (grad_output @ weight).
  CastConfig grad_output;
  /// The input's cast for the grad_weight GEMM (grad_output.t() @ input).
  CastConfig input_for_grad_weight;
  /// The weight's cast for the grad_input GEMM.
  CastConfig weight_for_grad_input;
  /// grad_output's cast for the grad_weight GEMM.
  CastConfig grad_output_for_grad_weight;
  /// use_fast_accum of at::_scaled_mm for the output GEMM.
  bool output_fast_accum = true;
  /// use_fast_accum for the grad_input GEMM.
  bool grad_input_fast_accum = false;
  /// use_fast_accum for the grad_weight GEMM.
  bool grad_weight_fast_accum = false;
  /// Dynamic scales are rounded down to a power of two (exact to apply and to undo).
  bool round_scales_to_power_of_2 = false;
  /// Set for the delayed recipe only.
  std::optional<DelayedScalingOptions> delayed_scaling;
  /// Cast through amp's fused kernels instead of torchao's sequence of eager ATen ops: one pass
  /// for the amax and one that writes the float8 copy in each layout its GEMMs want (a delayed
  /// cast: one pass for both), on the CPU and on CUDA. The same bits as the eager casts (tested
  /// on the CPU for every recipe, shape class and special value). Off by default: the CUDA
  /// kernels have not yet been measured on a GPU (docs/GUIDE.md, FP8 training).
  bool fused_casts = false;

  /// Throws c10::Error with a sentence when the recipe is inconsistent (a GEMM with one operand
  /// in float8 and one in high precision, an operand cast to two dtypes, a rowwise delayed cast,
  /// a non-float8 dtype, a history length below 1 or a negative margin).
  void validate() const;
};

/// What Float8Linear layers do with their weight's float8 casts from one forward to the next, for
/// gradient accumulation, where the weights stay the same for several micro-batches (Transformer
/// Engine's is_first_microbatch). The casts are the same bits whichever is chosen; keep and
/// reuse cast each weight once per optimizer step instead of once or twice per micro-batch.
enum class WeightCasts {
  /// Every forward casts its weight and keeps nothing (the default).
  fresh,
  /// Every forward casts its weight, for its GEMM and for the backward's, and the layer keeps
  /// the casts for later `reuse` forwards, replacing what it kept before: the first micro-batch
  /// after an optimizer step.
  keep,
  /// Forwards take the casts the layer kept at its last `keep` forward instead of casting: the
  /// step's later micro-batches. A promise that the weights have not changed since: amp refuses
  /// (c10::Error) a layer that kept nothing, whose weight is another tensor or storage (set_data,
  /// to()), or whose version counter moved (weight.add_() under NoGradGuard). amp's fused
  /// optimizers and torch::optim::AdamW's weight decay move it, so a step they took is seen;
  /// torch::optim::SGD and Adam write through .data() and their steps are not: the first
  /// micro-batch after each step must be `keep` in any case. A `keep` forward casts the weight
  /// even when its input has no rows (an MoE expert without tokens in that micro-batch). With the
  /// delayed recipe the weight's amax enters its history once per step.
  reuse,
};

/// An RAII float8 region, the counterpart of AutocastGuard and Transformer Engine's fp8_autocast:
/// inside it Float8Linear layers compute in float8; outside it (evaluation, debugging) they
/// compute exactly as torch::nn::Linear with the same parameters. The state is per thread: a new
/// thread starts outside, and a region opened in one thread does not reach others. Regions nest;
/// each restores the state it found. The choice is made at forward time: a backward pass follows
/// its forward, wherever and whenever it runs.
class AMP_EXPORT Float8AutocastGuard {
 public:
  /// enabled=false opens a region without float8 inside an enclosing one; `weight_casts` says
  /// what the region's forwards do with the weights' casts (see WeightCasts).
  explicit Float8AutocastGuard(bool enabled = true, WeightCasts weight_casts = WeightCasts::fresh);
  ~Float8AutocastGuard();
  Float8AutocastGuard(const Float8AutocastGuard&) = delete;
  Float8AutocastGuard& operator=(const Float8AutocastGuard&) = delete;

 private:
  bool previous_;
  WeightCasts previous_weight_casts_;
};

/// Whether this thread is inside an enabled Float8AutocastGuard.
AMP_EXPORT bool is_float8_enabled();

/// The WeightCasts of this thread's innermost Float8AutocastGuard (fresh outside any).
AMP_EXPORT WeightCasts current_weight_casts();

/// Applies the delayed-scaling amaxes that wait for a batched reduction
/// (amp::distributed::amax_all_reduce): one all-reduce per process group for all of them, then
/// each history and scale updated by the per-cast rule. amp calls it at the end of every backward
/// pass through a delayed Float8Linear (so a training step costs one collective, not one per cast)
/// and before casting a tensor whose previous amax still waits (so each cast sees the scale its
/// predecessors left). Call it yourself, on every rank, after forwards without a backward
/// (evaluation inside a float8 region) and before saving the module. Nothing waits, nothing runs.
/// Waiting amaxes are per process: it applies every layer's. So batched reductions serve one
/// training thread per process: a forward cast from a second thread while the first's amaxes
/// wait is refused (c10::Error), since either thread's flush would carry both and the ranks'
/// collectives could go out of order.
AMP_EXPORT void flush_delayed_scaling();

/// Options of Float8Linear: LinearOptions' three plus the recipe.
struct AMP_EXPORT Float8LinearOptions {
  /// Options for a layer mapping in_features to out_features, with a bias and tensorwise scaling.
  Float8LinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  /// The input's last dimension.
  TORCH_ARG(int64_t, in_features);
  /// The output's last dimension.
  TORCH_ARG(int64_t, out_features);
  /// Whether the layer adds a learned bias.
  TORCH_ARG(bool, bias) = true;
  /// How the GEMMs cast to float8 (validated when the layer is built).
  TORCH_ARG(Recipe, recipe) = Recipe::tensorwise();
};

namespace detail {
/// A weight's float8 casts kept across forwards (src/fp8/float8_function.h).
struct KeptWeightCasts;
}  // namespace detail

/// A linear layer with float8 GEMMs. It holds the parameters of torch::nn::Linear under the same
/// names ("weight" [out, in], "bias" [out]) in the module's dtype: they are the master weights
/// the optimizer updates, so state dicts and optimizers see an ordinary Linear. The delayed recipe
/// adds float32 buffers "amax_history_{input,weight,grad_output}" [history_len] and
/// "scale_{input,weight,grad_output}" [], saved and loaded with the module; they stay float32
/// when the module's dtype changes (to(), amp::to_low_precision).
///
/// forward(input [..., in]) -> [..., out]. Inside a Float8AutocastGuard the input and weight are
/// cast to float8 and multiplied with at::_scaled_mm, and the backward casts grad_output and
/// multiplies again, as torchao's Float8Linear does op for op: the output has the input's dtype,
/// or under CPU autocast the autocast dtype; with CUDA autocast on, the input is first cast to the
/// CUDA autocast dtype (torchao's rule). The bias is added in the output's dtype. Outside a region
/// it is torch::nn::functional::linear. Any layout of the input works (a permuted input gives the
/// bits of its contiguous copy); an input with no rows returns the empty result without casting
/// it (zero parameter gradients, the input and grad_output histories untouched; under
/// WeightCasts::keep the weight is still cast and kept). The backward computes grad_weight
/// only for a weight that requires grad and grad_input only for an input that does.
/// Errors (c10::Error): an input that is not float32/bfloat16/float16 or whose last dim is not
/// in_features; on CUDA, in_features or out_features not divisible by 16, or the rows when the
/// weight trains (at::_scaled_mm's rule; the message names the layer and the dimension).
class AMP_EXPORT Float8LinearImpl : public torch::nn::Cloneable<Float8LinearImpl>,
                                    public amp::detail::BufferRoles {
 public:
  /// A tensorwise layer with a bias, initialised as torch::nn::Linear(in_features, out_features).
  Float8LinearImpl(int64_t in_features, int64_t out_features)
      : Float8LinearImpl(Float8LinearOptions(in_features, out_features)) {}
  /// A layer per `options`, initialised as torch::nn::Linear. Throws c10::Error for an invalid
  /// recipe or a non-positive size.
  explicit Float8LinearImpl(Float8LinearOptions options);
  /// Shares `linear`'s weight and bias tensors (the same Parameters; no copy) on `linear`'s device
  /// and dtype: what convert_to_float8_training puts in its place.
  Float8LinearImpl(const torch::nn::LinearImpl& linear, Recipe recipe);

  /// (Re)creates the parameters and the delayed recipe's buffers, as Cloneable requires (a clone
  /// keeps no weight casts of its original).
  void reset() override;
  /// As Module::to, except that the delayed recipe's buffers stay float32 (a dtype change casts
  /// the parameters only; a device change moves everything).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  /// As Module::to(dtype), the delayed recipe's buffers left float32.
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  /// As Module::to(device): parameters and buffers move.
  void to(torch::Device device, bool non_blocking = false) override;
  /// torch::nn::Linear's initialisation (Kaiming-uniform weight, uniform bias).
  void reset_parameters();
  /// Prints "amp::fp8::Float8Linear(in_features=.., out_features=.., bias=.., recipe=..)".
  void pretty_print(std::ostream& stream) const override;
  /// input [..., in_features] -> [..., out_features]; see the class comment.
  at::Tensor forward(const at::Tensor& input);

  /// The delayed recipe's buffers (amax_history_*, scale_*) stay float32 when the dtype changes.
  bool keeps_float32(const std::string& name) const override;
  /// The delayed recipe's buffers are each rank's own, as Transformer Engine's float8 metadata:
  /// DistributedDataParallel does not broadcast them. Ranks agree on them only through
  /// DelayedScalingOptions::amax_reduction.
  bool rank_local(const std::string& name) const override;

  /// The qualified name convert_to_float8_training found the layer under ("" when built
  /// directly): error messages name the layer by it.
  const std::string& qualified_name() const { return qualified_name_; }
  /// Sets the name error messages use (convert_to_float8_training does).
  void set_qualified_name(std::string name) { qualified_name_ = std::move(name); }

  /// The options the layer was built with.
  Float8LinearOptions options;
  /// The learned weight [out_features, in_features] (the master copy).
  at::Tensor weight;
  /// The learned bias [out_features]; undefined without one.
  at::Tensor bias;

 private:
  void register_delayed_buffers();
  std::string qualified_name_;
  // What the last WeightCasts::keep forward cast (see WeightCasts); null when nothing is kept.
  std::shared_ptr<const detail::KeptWeightCasts> kept_weight_casts_;
};
TORCH_MODULE(Float8Linear);

/// Selects which layers convert_to_float8_training converts: called with each torch::nn::Linear's
/// qualified name ("fc1", "encoder.layers.0.proj") and the layer; true converts it. torchao's
/// module_filter_fn.
using ModuleFilter =
    std::function<bool(const std::string& name, const torch::nn::LinearImpl& linear)>;

/// Replaces every torch::nn::Linear below `module` that `filter` accepts (all when unset) with a
/// Float8Linear sharing its parameters (each keeps its requires_grad flag: frozen stays frozen),
/// in the module tree and in the containers that hold it
/// (Sequential, ModuleList, ModuleDict), so forward() calls the new layer. Call it before building
/// the optimizer. Returns the qualified names converted, in module order.
/// A Linear that something else also holds (typically a `torch::nn::Linear fc{nullptr}` member of
/// its parent, which a C++ program cannot re-point) cannot be swapped invisibly: the call throws
/// c10::Error naming it before changing anything; declare such a member as amp::fp8::Float8Linear
/// instead (it computes as Linear outside a Float8AutocastGuard), or exclude it with `filter`.
/// `module` itself is never replaced.
AMP_EXPORT std::vector<std::string> convert_to_float8_training(
    torch::nn::Module& module, const Recipe& recipe = Recipe::tensorwise(),
    const ModuleFilter& filter = nullptr);

}  // namespace amp::fp8
