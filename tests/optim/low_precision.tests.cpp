// The fused optimizers' low-precision modes: updates that bf16 round-to-nearest loses and master
// weights, Kahan summation and stochastic rounding keep; stochastic rounding's statistics and
// seeding; skipped steps; checkpoints; refusals; amp::to_low_precision.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <amp/autocast.h>
#include <amp/grad_scaler.h>
#include <amp/low_precision.h>
#include <amp/optim.h>

#include "kernels/dtype.h"
#include "support/host_reads.h"
#include "support/optim_helpers.h"

namespace {

enum class Mode { kNearest, kMaster, kKahan, kStochastic };

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kNearest:
      return "round to nearest";
    case Mode::kMaster:
      return "master weights";
    case Mode::kKahan:
      return "Kahan summation";
    case Mode::kStochastic:
      return "stochastic rounding";
  }
  return "";
}

template <typename Options>
Options with_mode(Options options, Mode mode, int64_t seed = 0) {
  return options.master_weights(mode == Mode::kMaster)
      .kahan_summation(mode == Mode::kKahan)
      .stochastic_rounding(mode == Mode::kStochastic)
      .rounding_seed(seed);
}

// `steps` FusedSGD steps (lr 1) with the gradient -`increment` on `count` weights starting at 1.
torch::Tensor sgd_increments(torch::Dtype dtype, std::optional<Mode> mode, int steps,
                             float increment, int64_t count = 4096, int64_t seed = 0) {
  auto w = torch::ones({count}, torch::dtype(dtype)).requires_grad_(true);
  auto options = FusedSGDOptions(1.0);
  if (mode) options = with_mode(options, *mode, seed);
  FusedSGD opt({w}, options);
  for (int k = 0; k < steps; ++k) {
    w.mutable_grad() = torch::full({count}, -increment, torch::dtype(dtype));
    opt.step();
  }
  return w.detach().to(torch::kFloat);
}

}  // namespace

TEST_CASE("bf16 round to nearest loses every small update, and master, Kahan and SR keep them",
          "[optim][low_precision]") {
  // 1000 steps of +1e-4 (as bf16 rounds it: 1.0013580322265625e-4) on weights at 1.0.
  const float increment = c10::BFloat16(1e-4f);
  const float fp32 = sgd_increments(torch::kFloat, std::nullopt, 1000, increment)[0].item<float>();
  REQUIRE(fp32 == Approx(1.0 + 1000.0 * increment).epsilon(1e-5));
  const double moved = fp32 - 1.0;

  // Plain bf16 (ATen's kernel) and amp's round-to-nearest write-back both stay at 1.0.
  CHECK(
      sgd_increments(torch::kBFloat16, std::nullopt, 1000, increment).eq(1.0f).all().item<bool>());
  CHECK(sgd_increments(torch::kBFloat16, Mode::kNearest, 1000, increment)
            .eq(1.0f)
            .all()
            .item<bool>());

  for (const Mode mode : {Mode::kMaster, Mode::kKahan, Mode::kStochastic}) {
    INFO(mode_name(mode));
    const auto w = sgd_increments(torch::kBFloat16, mode, 1000, increment);
    const double mean = w.mean().item<double>();
    INFO("mean " << mean << " vs fp32 " << fp32);
    // Within 1% of fp32's value. Master and Kahan element by element, within half a bf16 step
    // (2^-8 above 1): the bf16 nearest to what fp32 reached. SR on average, within 1% of what
    // fp32 moved (0.1).
    CHECK(std::abs(mean - fp32) <= 0.01 * fp32);
    if (mode == Mode::kStochastic) {
      CHECK(std::abs(mean - fp32) <= 0.01 * moved);
    } else {
      CHECK((w - fp32).abs().max().item<double>() <= std::ldexp(1.0, -8));
    }
  }
  // fp16 parameters: master weights and Kahan (fp16's step at 1.0 is 2^-10 ~ 9.8e-4 > 1e-4).
  const float increment16 = c10::Half(1e-4f);
  const float fp32_16 =
      sgd_increments(torch::kFloat, std::nullopt, 1000, increment16)[0].item<float>();
  CHECK(sgd_increments(torch::kHalf, std::nullopt, 1000, increment16).eq(1.0f).all().item<bool>());
  for (const Mode mode : {Mode::kMaster, Mode::kKahan}) {
    INFO("fp16, " << mode_name(mode));
    const auto w = sgd_increments(torch::kHalf, mode, 1000, increment16);
    CHECK((w - fp32_16).abs().max().item<double>() <= std::ldexp(1.0, -11));  // half a step
  }
}

TEST_CASE("Stochastic rounding is unbiased and rounds up with the probability of the distance",
          "[optim][low_precision]") {
  // One step moves 1M weights from 1.0 to 1 + f * 2^-7, between the bf16 values 1 and 1 + 2^-7.
  const double ulp = std::ldexp(1.0, -7);
  const int64_t n = 1 << 20;
  for (const double fraction : {0.25, 0.625, 1.0 / 32}) {
    INFO("fraction " << fraction);
    const auto w = sgd_increments(torch::kBFloat16, Mode::kStochastic, 1,
                                  static_cast<float>(fraction * ulp), n, /*seed=*/5);
    const auto up = w.eq(static_cast<float>(1.0 + ulp));
    REQUIRE((up | w.eq(1.0f)).all().item<bool>());  // only the two neighbours
    const double p = up.to(torch::kDouble).mean().item<double>();
    const double sigma = std::sqrt(fraction * (1 - fraction) / n);
    CHECK(std::abs(p - fraction) <= 3 * sigma);
    // Unbiased: the mean is the exact value 1 + f * 2^-7, within 3 standard errors.
    const double mean = w.to(torch::kDouble).mean().item<double>();
    CHECK(std::abs(mean - (1.0 + fraction * ulp)) <= 3 * sigma * ulp);
  }
}

TEST_CASE("Stochastic rounding: a seed gives the same bits every run, another seed others",
          "[optim][low_precision]") {
  const float inc = static_cast<float>(0.5 * std::ldexp(1.0, -7));
  const auto a = sgd_increments(torch::kBFloat16, Mode::kStochastic, 3, inc, 4096, 42);
  const auto b = sgd_increments(torch::kBFloat16, Mode::kStochastic, 3, inc, 4096, 42);
  const auto c = sgd_increments(torch::kBFloat16, Mode::kStochastic, 3, inc, 4096, 43);
  CHECK(same_bits(a, b));
  CHECK_FALSE(same_bits(a, c));
  // Each step draws new bits: after three steps of half a ulp, 1, 1 + 2^-7 and 1 + 2^-6 all
  // occur among the 4096 weights (the same bits every step would leave only 1 and 1 + 3 * 2^-8
  // rounded the same way each time).
  for (const double k : {0.0, 1.0, 2.0}) {
    CHECK(a.eq(static_cast<float>(1.0 + k * std::ldexp(1.0, -7))).any().item<bool>());
  }
}

TEST_CASE("A skipped step leaves parameters, master copies, compensation and state untouched",
          "[optim][low_precision][scaler]") {
  const Mode mode = GENERATE(Mode::kMaster, Mode::kKahan, Mode::kStochastic);
  const bool sgd = GENERATE(false, true);
  INFO(mode_name(mode) << (sgd ? ", FusedSGD" : ", FusedAdamW"));
  torch::manual_seed(3);
  auto net =
      torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  amp::to_low_precision(*net, torch::kBFloat16);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (sgd) {
    opt = std::make_unique<FusedSGD>(net->parameters(),
                                     with_mode(FusedSGDOptions(0.1).momentum(0.9), mode, 9));
  } else {
    opt = std::make_unique<FusedAdamW>(net->parameters(),
                                       with_mode(FusedAdamWOptions(0.01), mode, 9));
  }
  amp::GradScaler scaler(c10::DeviceType::CPU, amp::GradScalerOptions().init_scale(256.0));
  const auto run_step = [&](int k, bool poison) {
    opt->zero_grad();
    torch::manual_seed(100 + k);
    const auto x = torch::randn({4, 6}).to(torch::kBFloat16);
    const auto loss = net->forward(x).to(torch::kFloat).pow(2).mean();
    scaler.scale(loss).backward();
    if (poison) {
      torch::NoGradGuard no_grad;
      net->parameters()[2].grad()[0][0] = std::numeric_limits<float>::infinity();
    }
    amp_test::HostReadRecorder recorder;
    scaler.step(*opt);
    scaler.update();
    INFO((recorder.reads().empty() ? "" : recorder.reads().front()));
    CHECK(recorder.reads().empty());  // the skip is decided without a host read
  };
  run_step(0, false);
  run_step(1, false);
  std::ostringstream before;
  torch::save(*opt, before);
  std::vector<torch::Tensor> params_before;
  for (const auto& p : net->parameters()) params_before.push_back(p.detach().clone());
  run_step(2, true);
  CHECK(all_same_bits(params_before, net->parameters()));
  std::ostringstream after;
  torch::save(*opt, after);
  CHECK(before.str() == after.str());  // every state tensor, master copy and count
  run_step(3, false);
  CHECK_FALSE(all_same_bits(params_before, net->parameters()));
}

TEST_CASE("Checkpoints hold master copies, compensation and counts, and adapt to the options",
          "[optim][low_precision]") {
  torch::manual_seed(4);
  auto w = torch::randn({32}).to(torch::kBFloat16).requires_grad_(true);
  FusedAdamW opt({w}, FusedAdamWOptions(0.01).master_weights(true));
  w.mutable_grad() = torch::randn({32}).to(torch::kBFloat16);
  opt.step();
  const auto& state =
      static_cast<const FusedAdamParamState&>(*opt.state().at(w.unsafeGetTensorImpl()));
  REQUIRE(state.master_weight().scalar_type() == torch::kFloat);
  CHECK(state.exp_avg().scalar_type() == torch::kFloat);  // fp32 moments with master weights
  CHECK(same_bits(state.master_weight().to(torch::kBFloat16), w.detach()));
  std::ostringstream saved;
  torch::save(opt, saved);

  SECTION("a fresh optimizer with the same options gets everything back") {
    FusedAdamW fresh({w}, FusedAdamWOptions(0.01).master_weights(true));
    std::istringstream in(saved.str());
    torch::load(fresh, in);
    const auto& loaded =
        static_cast<const FusedAdamParamState&>(*fresh.state().at(w.unsafeGetTensorImpl()));
    CHECK(loaded == state);
    CHECK(
        static_cast<const FusedAdamWOptions&>(fresh.param_groups()[0].options()).master_weights());
  }
  SECTION("the checkpoint's options apply: Kahan in place of master weights drops the copy") {
    FusedAdamW other({w}, FusedAdamWOptions(0.01).kahan_summation(true));
    std::istringstream in(saved.str());
    torch::load(other, in);  // the checkpoint's options (master weights) replace the group's
    const auto& loaded =
        static_cast<const FusedAdamParamState&>(*other.state().at(w.unsafeGetTensorImpl()));
    CHECK(loaded.master_weight().defined());
  }
  SECTION("LibTorch's AdamW reads past the extra entries") {
    auto w32 = w.detach().to(torch::kFloat).requires_grad_(true);
    torch::optim::AdamW libtorch({w32}, torch::optim::AdamWOptions(0.01));
    std::istringstream in(saved.str());
    torch::load(libtorch, in);
    const auto& loaded = static_cast<const torch::optim::AdamWParamState&>(
        *libtorch.state().at(w32.unsafeGetTensorImpl()));
    CHECK(loaded.step() == 1);
    CHECK(same_bits(loaded.exp_avg(), state.exp_avg()));
  }
}

TEST_CASE("Low-precision options that make no sense are refused with a sentence",
          "[optim][low_precision]") {
  auto bf16 = torch::zeros({4}, torch::kBFloat16).requires_grad_(true);
  auto fp16 = torch::zeros({4}, torch::kHalf).requires_grad_(true);
  auto fp32 = torch::zeros({4}).requires_grad_(true);
  CHECK_THROWS_WITH(
      FusedAdamW({bf16}, FusedAdamWOptions().master_weights(true).kahan_summation(true)),
      Contains("are alternatives") && Contains("Choose one"));
  CHECK_THROWS_WITH(FusedSGD({fp16}, FusedSGDOptions(0.1).stochastic_rounding(true)),
                    Contains("parameter 0 is Half") && Contains("bfloat16 only"));
  CHECK_THROWS_WITH(
      amp::optim::FusedAdam({fp32}, amp::optim::FusedAdamOptions().master_weights(true)),
      Contains("none of the optimizer's parameters is one") && Contains("amp::to_low_precision"));
  CHECK_THROWS_WITH(
      FusedAdamW({bf16}, FusedAdamWOptions().state_dtype(torch::kDouble)),
      Contains("state_dtype must be Float, BFloat16 or Half. Got state_dtype=Double"));
  CHECK_THROWS_WITH(FusedAdamW({bf16}, FusedAdamWOptions().capturable(true).kahan_summation(true)),
                    Contains("capturable(true) cannot be combined"));
  // fp32 parameters next to bf16 ones are updated by ATen's kernel as before.
  FusedAdamW mixed({bf16, fp32}, FusedAdamWOptions(0.1).kahan_summation(true));
  bf16.mutable_grad() = torch::ones({4}, torch::kBFloat16);
  fp32.mutable_grad() = torch::ones({4});
  mixed.step();
  const auto& s32 =
      static_cast<const FusedAdamParamState&>(*mixed.state().at(fp32.unsafeGetTensorImpl()));
  CHECK_FALSE(s32.kahan_comp().defined());
  CHECK(torch::allclose(fp32.detach(), torch::full({4}, -0.1f), 1e-6, 1e-7));
  const auto& s16 =
      static_cast<const FusedAdamParamState&>(*mixed.state().at(bf16.unsafeGetTensorImpl()));
  CHECK(s16.kahan_comp().scalar_type() == torch::kBFloat16);
  CHECK(s16.exp_avg().scalar_type() == torch::kFloat);  // the default state dtype
}

TEST_CASE("to_low_precision casts weights, keeps normalisation layers and integer buffers",
          "[optim][low_precision]") {
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8),
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})),
                            torch::nn::Linear(8, 2));
  const auto first = net->parameters()[0];
  amp::to_low_precision(*net, torch::kBFloat16);
  for (const auto& item : net->named_parameters()) {
    INFO(item.key());
    const bool norm = item.key().rfind("1.", 0) == 0 || item.key().rfind("2.", 0) == 0;
    CHECK(item.value().scalar_type() == (norm ? torch::kFloat : torch::kBFloat16));
  }
  for (const auto& item : net->named_buffers()) {
    INFO(item.key());
    const bool counter = item.key().find("num_batches_tracked") != std::string::npos;
    CHECK(item.value().scalar_type() == (counter ? torch::kLong : torch::kFloat));
  }
  CHECK(first.unsafeGetTensorImpl() == net->parameters()[0].unsafeGetTensorImpl());

  // A custom predicate: keep the last Linear (its whole subtree) instead.
  torch::nn::Sequential other(torch::nn::Linear(4, 8), torch::nn::Linear(8, 2));
  amp::to_low_precision(
      *other, torch::kHalf,
      [](const std::string& name, const torch::nn::Module&) { return name == "1"; });
  CHECK(other->parameters()[0].scalar_type() == torch::kHalf);
  CHECK(other->parameters()[3].scalar_type() == torch::kFloat);
  CHECK_THROWS_WITH(amp::to_low_precision(*other, torch::kFloat),
                    Contains("dtype must be BFloat16 or Half. Got dtype=Float"));
}

TEST_CASE("bf16 weights under bf16 autocast train with master weights", "[optim][low_precision]") {
  torch::manual_seed(8);
  auto net =
      torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  amp::to_low_precision(*net, torch::kBFloat16);
  FusedAdamW opt(net->parameters(), FusedAdamWOptions(1e-2).master_weights(true));
  const auto x = torch::randn({64, 16});
  const auto y = x.sum(1, true);
  double first = 0, last = 0;
  for (int k = 0; k < 60; ++k) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      amp::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16);
      loss = torch::mse_loss(net->forward(x).to(torch::kFloat), y);  // x: float32, cast by autocast
    }
    loss.backward();
    opt.step();
    (k == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.2 * first);
}

TEST_CASE("The kernels' float16 and bfloat16 conversions give c10's bits",
          "[optim][low_precision]") {
  namespace kernels = amp::kernels;
  const auto bits = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    return u;
  };
  // Loads: every one of the 65,536 patterns, subnormals, infinities and NaN payloads included.
  int load_differences = 0;
  for (uint32_t raw = 0; raw <= 0xFFFFu; ++raw) {
    const auto h = static_cast<uint16_t>(raw);
    const bool same = bits(kernels::F16::load(h)) ==
                          bits(static_cast<float>(c10::Half(h, c10::Half::from_bits()))) &&
                      bits(kernels::Bf16::load(h)) ==
                          bits(static_cast<float>(c10::BFloat16(h, c10::BFloat16::from_bits())));
    load_differences += same ? 0 : 1;
  }
  CHECK(load_differences == 0);
  // Stores: a stride through all float32 patterns (both signs, every exponent), and the values
  // either side of each float16 rounding boundary (overflow at 65520, the subnormal range).
  std::vector<float> values;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4093) {
    float v;
    const auto u32 = static_cast<uint32_t>(u);
    std::memcpy(&v, &u32, sizeof(v));
    values.push_back(v);
  }
  for (float edge : {65504.0f, 65519.996f, 65520.0f, 65536.0f, 6.1035156e-05f, 5.9604645e-08f,
                     2.9802322e-08f, 2.9802326e-08f, 8.940697e-08f, 0.0f, 1.0f + 1.0f / 2048.0f,
                     std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max()}) {
    for (float v : {edge, std::nextafter(edge, 0.0f), std::nextafter(edge, 1e30f)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  // Compared in bulk: the first disagreement, if any, is reported with its input.
  std::string first_difference;
  for (float v : values) {
    const bool nan = std::isnan(v);
    const uint16_t want_half =
        nan ? static_cast<uint16_t>((bits(v) >> 16 & 0x8000u) | 0x7E00u) : c10::Half(v).x;
    const uint16_t want_bf16 = nan ? uint16_t{0x7FC0} : c10::BFloat16(v).x;
    if (first_difference.empty() &&
        (kernels::F16::store(v) != want_half || kernels::Bf16::store(v) != want_bf16)) {
      std::ostringstream out;
      out << "value " << v << " (0x" << std::hex << bits(v) << "): float16 0x"
          << kernels::F16::store(v) << " vs 0x" << want_half << ", bfloat16 0x"
          << kernels::Bf16::store(v) << " vs 0x" << want_bf16;
      first_difference = out.str();
    }
  }
  CHECK(values.size() > 1000000);
  CHECK(first_difference == "");  // on failure Catch2 prints the difference
}

TEST_CASE("Adam's moments keep every update by default under Kahan summation and SR",
          "[optim][low_precision]") {
  // 4,096 bf16 weights at 1.0, FusedAdamW (lr 1e-4, no weight decay), gradient -1 for 1,000
  // steps: each step moves a weight by ~lr, so fp32 ends at 1.1. Moments kept in bf16 stop
  // moving once Adam's increment 0.001 * (g^2 - exp_avg_sq) is below half a bf16 step: the
  // second moment stays too small and every step is too large (1.125 with Kahan). The default
  // state is float32, so only the write-back rounds.
  // Returns the weights after the run and the dtypes of exp_avg and exp_avg_sq.
  const auto run = [](std::optional<Mode> mode, torch::Dtype dtype,
                      std::optional<c10::ScalarType> state_dtype) {
    auto w = torch::ones({4096}, torch::dtype(dtype)).requires_grad_(true);
    auto options = FusedAdamWOptions(1e-4).weight_decay(0.0);
    if (mode) options = with_mode(options, *mode, 7);
    if (state_dtype) options.state_dtype(state_dtype);
    FusedAdamW opt({w}, options);
    for (int k = 0; k < 1000; ++k) {
      w.mutable_grad() = torch::full({4096}, -1.0, torch::dtype(dtype));
      opt.step();
    }
    const auto& state =
        static_cast<const FusedAdamParamState&>(*opt.state().at(w.unsafeGetTensorImpl()));
    return std::make_tuple(w.detach().to(torch::kFloat), state.exp_avg().scalar_type(),
                           state.exp_avg_sq().scalar_type());
  };
  const double fp32 =
      std::get<0>(run(std::nullopt, torch::kFloat, std::nullopt)).mean().item<double>();
  REQUIRE(fp32 == Approx(1.1).epsilon(1e-4));
  const double bf16_step = std::ldexp(1.0, -7);  // between 1 and 2
  for (const Mode mode : {Mode::kMaster, Mode::kKahan, Mode::kStochastic}) {
    INFO(mode_name(mode));
    const auto [w, m_dtype, v_dtype] = run(mode, torch::kBFloat16, std::nullopt);
    const double mean = w.mean().item<double>();
    INFO("mean " << mean << " vs fp32 " << fp32);
    // Master and Kahan: the bf16 nearest to 1.1 everywhere; SR: within 1% of the 0.1 moved.
    if (mode == Mode::kStochastic) {
      CHECK(std::abs(mean - fp32) <= 0.01 * (fp32 - 1.0));
    } else {
      CHECK((w - fp32).abs().max().item<double>() <= bf16_step / 2);
    }
    // The default state dtype is float32 for every write-back.
    CHECK(m_dtype == torch::kFloat);
    CHECK(v_dtype == torch::kFloat);
  }
  // Asked for explicitly, bf16 moments still give the compact state, and lose the updates: the
  // documented trade.
  const double compact =
      std::get<0>(run(Mode::kKahan, torch::kBFloat16, torch::kBFloat16)).mean().item<double>();
  CHECK(compact > fp32 + 0.01);
}
