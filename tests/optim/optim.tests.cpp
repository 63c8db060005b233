// amp's fused optimizers on their own: LibTorch's option names and defaults, the numbers of
// LibTorch's optimizers, param groups, checkpoints in LibTorch's layout both ways, bad input.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <amp/optim.h>

#include "support/optim_helpers.h"

using amp::optim::FusedAdam;
using amp::optim::FusedAdamOptions;

namespace {

// Three parameters of different shapes (one 0-dim), seeded.
std::vector<torch::Tensor> make_params(uint64_t seed, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  return {torch::randn({5, 3}).to(dtype).requires_grad_(true),
          torch::randn({7}).to(dtype).requires_grad_(true),
          torch::randn({}).to(dtype).requires_grad_(true)};
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// Gradients for step `k`, the same for every copy of the parameters.
void set_grads(std::vector<torch::Tensor>& params, int k) {
  for (size_t i = 0; i < params.size(); ++i) {
    torch::manual_seed(1000 * k + i);
    params[i].mutable_grad() = torch::randn(params[i].sizes()).to(params[i].scalar_type());
  }
}

// Steps `opt` three times beside a one-group FusedAdamW with `options` over a copy of
// params[index], with the same gradients, and requires that parameter's bits to match.
void require_steps_as_alone(torch::optim::Optimizer& opt, std::vector<torch::Tensor>& params,
                            size_t index, const FusedAdamWOptions& options) {
  auto alone = clones({params[index]});
  FusedAdamW single(alone, options);
  for (int k = 0; k < 3; ++k) {
    set_grads(params, k);
    alone[0].mutable_grad() = params[index].grad().clone();
    opt.step();
    single.step();
  }
  CHECK(same_bits(params[index].detach(), alone[0].detach()));
}

void train(torch::optim::Optimizer& opt, std::vector<torch::Tensor>& params, int first, int last) {
  for (int k = first; k < last; ++k) {
    set_grads(params, k);
    opt.step();
  }
}

void check_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i << " max abs diff " << (a[i] - b[i]).abs().max().item<double>());
    CHECK(torch::allclose(a[i].detach(), b[i].detach(), 1e-5, 1e-6));
  }
}

// Trains LibTorch's `ref` and amp's `fused`, each on its own copy of the parameters, through
// steps [first, last) with the same gradients, and checks that they agree to float32 rounding.
void train_both(torch::optim::Optimizer& ref, std::vector<torch::Tensor>& ref_params,
                torch::optim::Optimizer& fused, std::vector<torch::Tensor>& params, int first,
                int last) {
  train(ref, ref_params, first, last);
  train(fused, params, first, last);
  check_close(params, ref_params);
}

std::string saved(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_into(torch::optim::Optimizer& opt, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  opt.load(archive);
}

// The state `opt` keeps for `param`.
template <typename State>
const State& state_of(const torch::optim::Optimizer& opt, const torch::Tensor& param) {
  return static_cast<const State&>(*opt.state().at(param.unsafeGetTensorImpl()));
}

}  // namespace

TEST_CASE("Options and param states compare field by field", "[optim]") {
  CHECK(FusedAdamOptions(0.01) == FusedAdamOptions(0.01));
  CHECK_FALSE(FusedAdamOptions(0.01) == FusedAdamOptions(0.02));
  CHECK_FALSE(FusedAdamWOptions().amsgrad(true) == FusedAdamWOptions());
  CHECK_FALSE(FusedAdamWOptions().betas({0.8, 0.999}) == FusedAdamWOptions());
  CHECK_FALSE(FusedSGDOptions(0.1).nesterov(true).momentum(0.9) ==
              FusedSGDOptions(0.1).momentum(0.9));
  CHECK_FALSE(FusedSGDOptions(0.1).capturable(true) == FusedSGDOptions(0.1));

  FusedAdamParamState a;
  a.step(torch::full({}, 3.0f)).exp_avg(torch::ones({2})).exp_avg_sq(torch::zeros({2}));
  FusedAdamParamState b;
  b.step(torch::full({}, 3.0f)).exp_avg(torch::ones({2})).exp_avg_sq(torch::zeros({2}));
  CHECK(a == b);
  b.max_exp_avg_sq(torch::zeros({2}));  // defined on one side only
  CHECK_FALSE(a == b);
  b.max_exp_avg_sq(torch::Tensor());
  b.exp_avg(torch::ones({2}, torch::kDouble));  // same values, another dtype
  CHECK_FALSE(a == b);
  b.exp_avg(torch::tensor({1.0f, 2.0f}));
  CHECK_FALSE(a == b);

  amp::optim::FusedSGDParamState none;
  amp::optim::FusedSGDParamState buffer;
  buffer.momentum_buffer(torch::zeros({3}));
  CHECK(none == amp::optim::FusedSGDParamState());
  CHECK_FALSE(none == buffer);
}

TEST_CASE("A param group with another optimizer's options type is refused with a sentence",
          "[optim]") {
  auto params = make_params(4);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0]},
                      std::make_unique<torch::optim::AdamWOptions>(0.1));
  CHECK_THROWS_WITH(
      FusedAdamW(groups, FusedAdamWOptions()),
      Contains("FusedAdamW: the options of param group 0 are not FusedAdamWOptions") &&
          Contains("Pass FusedAdamWOptions, or leave the group's options out"));
  std::vector<torch::optim::OptimizerParamGroup> sgd_groups;
  sgd_groups.emplace_back(std::vector<torch::Tensor>{params[1]},
                          std::make_unique<FusedAdamOptions>(0.1));
  CHECK_THROWS_WITH(FusedSGD(sgd_groups, FusedSGDOptions(0.1)),
                    Contains("FusedSGD: the options of param group 0 are not FusedSGDOptions"));
}

TEST_CASE("Fused options have LibTorch's names and defaults", "[optim]") {
  const torch::optim::AdamOptions adam;
  const FusedAdamOptions fused_adam;
  CHECK(fused_adam.lr() == adam.lr());
  CHECK(fused_adam.betas() == adam.betas());
  CHECK(fused_adam.eps() == adam.eps());
  CHECK(fused_adam.weight_decay() == adam.weight_decay());
  CHECK(fused_adam.amsgrad() == adam.amsgrad());
  const torch::optim::AdamWOptions adamw;
  const FusedAdamWOptions fused_adamw;
  CHECK(fused_adamw.lr() == adamw.lr());
  CHECK(fused_adamw.betas() == adamw.betas());
  CHECK(fused_adamw.eps() == adamw.eps());
  CHECK(fused_adamw.weight_decay() == adamw.weight_decay());
  CHECK(fused_adamw.amsgrad() == adamw.amsgrad());
  const torch::optim::SGDOptions sgd(0.1);
  const FusedSGDOptions fused_sgd(0.1);
  CHECK(fused_sgd.lr() == sgd.lr());
  CHECK(fused_sgd.momentum() == sgd.momentum());
  CHECK(fused_sgd.dampening() == sgd.dampening());
  CHECK(fused_sgd.weight_decay() == sgd.weight_decay());
  CHECK(fused_sgd.nesterov() == sgd.nesterov());
  CHECK_FALSE(fused_adam.maximize());
  CHECK_FALSE(fused_adamw.capturable());
  CHECK_FALSE(fused_sgd.maximize());
}

TEST_CASE("FusedAdamW and FusedAdam follow LibTorch's AdamW and Adam to float32 rounding",
          "[optim]") {
  const bool amsgrad = GENERATE(false, true);
  const double weight_decay = GENERATE(0.0, 0.1);
  INFO("amsgrad " << amsgrad << " weight_decay " << weight_decay);
  auto ref_params = make_params(1);
  auto params = clones(ref_params);
  {
    torch::optim::AdamW ref(
        ref_params, torch::optim::AdamWOptions(0.01).weight_decay(weight_decay).amsgrad(amsgrad));
    FusedAdamW fused(params, FusedAdamWOptions(0.01).weight_decay(weight_decay).amsgrad(amsgrad));
    train_both(ref, ref_params, fused, params, 0, 6);
    // The state a user inspects: the step count (a float32 device tensor) and the moments.
    const auto& state =
        static_cast<const FusedAdamParamState&>(*fused.state().at(params[0].unsafeGetTensorImpl()));
    CHECK(state.step().item<float>() == 6.0f);
    CHECK(state.step().scalar_type() == torch::kFloat);
    CHECK(state.max_exp_avg_sq().defined() == amsgrad);
  }
  auto ref_adam_params = make_params(2);
  auto adam_params = clones(ref_adam_params);
  torch::optim::Adam ref(
      ref_adam_params, torch::optim::AdamOptions(0.01).weight_decay(weight_decay).amsgrad(amsgrad));
  FusedAdam fused(adam_params, FusedAdamOptions(0.01).weight_decay(weight_decay).amsgrad(amsgrad));
  train_both(ref, ref_adam_params, fused, adam_params, 0, 6);
}

TEST_CASE("FusedSGD follows LibTorch's SGD with momentum, dampening, nesterov and weight decay",
          "[optim]") {
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  const Case c = GENERATE(Case{0.0, 0.0, 0.0, false}, Case{0.9, 0.0, 0.0, false},
                          Case{0.9, 0.1, 1e-3, false}, Case{0.9, 0.0, 1e-2, true});
  INFO("momentum " << c.momentum << " dampening " << c.dampening << " wd " << c.weight_decay
                   << " nesterov " << c.nesterov);
  auto ref_params = make_params(3);
  auto params = clones(ref_params);
  torch::optim::SGD ref(ref_params, torch::optim::SGDOptions(0.05)
                                        .momentum(c.momentum)
                                        .dampening(c.dampening)
                                        .weight_decay(c.weight_decay)
                                        .nesterov(c.nesterov));
  FusedSGD fused(params, FusedSGDOptions(0.05)
                             .momentum(c.momentum)
                             .dampening(c.dampening)
                             .weight_decay(c.weight_decay)
                             .nesterov(c.nesterov));
  train_both(ref, ref_params, fused, params, 0, 5);
  CHECK(fused.state().empty() == (c.momentum == 0.0));
}

TEST_CASE("maximize ascends: the step equals minimising the negated gradient", "[optim]") {
  auto up = make_params(4);
  auto down = clones(up);
  FusedAdamW ascending(up, FusedAdamWOptions(0.01).maximize(true));
  FusedAdamW descending(down, FusedAdamWOptions(0.01));
  for (int k = 0; k < 3; ++k) {
    set_grads(up, k);
    set_grads(down, k);
    for (auto& p : down) p.mutable_grad() = -p.grad();
    ascending.step();
    descending.step();
  }
  CHECK(all_same_bits(up, down));
}

TEST_CASE("Param groups: each group's options, defaults for fields it leaves unset", "[optim]") {
  auto params = make_params(5);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]});
  groups.emplace_back(std::vector<torch::Tensor>{params[2]},
                      std::make_unique<FusedAdamWOptions>(FusedAdamWOptions().weight_decay(0.5)));
  FusedAdamW opt(groups, FusedAdamWOptions(0.02).betas({0.8, 0.99}));
  const auto& g0 = static_cast<const FusedAdamWOptions&>(opt.param_groups()[0].options());
  const auto& g1 = static_cast<const FusedAdamWOptions&>(opt.param_groups()[1].options());
  CHECK(g0.lr() == 0.02);
  CHECK(g1.lr() == 0.02);  // inherited
  CHECK(g1.betas() == std::make_tuple(0.8, 0.99));
  CHECK(g1.weight_decay() == 0.5);  // its own
  CHECK(g0.weight_decay() == 1e-2);

  // A group with another lr moves by that lr: the same as a one-group optimizer with it.
  static_cast<FusedAdamWOptions&>(opt.param_groups()[1].options()).lr(0.2);
  require_steps_as_alone(opt, params, 2,
                         FusedAdamWOptions(0.2).betas({0.8, 0.99}).weight_decay(0.5));
  opt.zero_grad();
  CHECK_FALSE(params[0].grad().defined());
}

TEST_CASE("Mixed parameter dtypes in one group: each dtype updated in its own precision",
          "[optim]") {
  auto f32 = make_params(6);
  auto bf16 = make_params(6, torch::kBFloat16);
  std::vector<torch::Tensor> mixed{f32[0], bf16[1], f32[2]};
  auto f32_only = clones({f32[0], f32[2]});
  auto bf16_only = clones({bf16[1]});
  FusedAdamW opt(mixed, FusedAdamWOptions(0.01));
  FusedAdamW opt_f32(f32_only, FusedAdamWOptions(0.01));
  FusedAdamW opt_bf16(bf16_only, FusedAdamWOptions(0.01));
  for (int k = 0; k < 3; ++k) {
    set_grads(mixed, k);
    f32_only[0].mutable_grad() = mixed[0].grad().clone();
    f32_only[1].mutable_grad() = mixed[2].grad().clone();
    bf16_only[0].mutable_grad() = mixed[1].grad().clone();
    opt.step();
    opt_f32.step();
    opt_bf16.step();
  }
  CHECK(mixed[1].scalar_type() == torch::kBFloat16);
  CHECK(same_bits(mixed[0].detach(), f32_only[0].detach()));
  CHECK(same_bits(mixed[2].detach(), f32_only[1].detach()));
  CHECK(same_bits(mixed[1].detach(), bf16_only[0].detach()));
}

TEST_CASE("A checkpoint resumes bit for bit, and loads into a fresh optimizer", "[optim]") {
  auto straight = make_params(7);
  auto resumed = clones(straight);
  FusedAdamW uninterrupted(straight, FusedAdamWOptions(0.01).amsgrad(true));
  train(uninterrupted, straight, 0, 3);
  const std::string checkpoint = saved(uninterrupted);
  train(uninterrupted, straight, 3, 6);

  // A restarted job: the parameters as they were at the checkpoint, another lr until loaded.
  FusedAdamW first_run(resumed, FusedAdamWOptions(0.01).amsgrad(true));
  train(first_run, resumed, 0, 3);
  auto restarted = clones(resumed);
  FusedAdamW fresh(restarted, FusedAdamWOptions(0.5));
  load_into(fresh, checkpoint);
  CHECK(static_cast<const FusedAdamWOptions&>(fresh.param_groups()[0].options()) ==
        FusedAdamWOptions(0.01).amsgrad(true));
  for (size_t i = 0; i < restarted.size(); ++i) {
    CHECK(state_of<FusedAdamParamState>(fresh, restarted[i]) ==
          state_of<FusedAdamParamState>(first_run, resumed[i]));
  }
  train(fresh, restarted, 3, 6);
  CHECK(all_same_bits(restarted, straight));

  auto sgd_straight = make_params(8);
  auto sgd_restarted = clones(sgd_straight);
  FusedSGD sgd(sgd_straight, FusedSGDOptions(0.05).momentum(0.9).nesterov(true));
  train(sgd, sgd_straight, 0, 2);
  const std::string sgd_checkpoint = saved(sgd);
  for (size_t i = 0; i < sgd_straight.size(); ++i) {
    sgd_restarted[i].data().copy_(sgd_straight[i].detach());
  }
  train(sgd, sgd_straight, 2, 4);
  FusedSGD sgd_fresh(sgd_restarted, FusedSGDOptions(1.0));
  load_into(sgd_fresh, sgd_checkpoint);
  CHECK(static_cast<const FusedSGDOptions&>(sgd_fresh.param_groups()[0].options()) ==
        FusedSGDOptions(0.05).momentum(0.9).nesterov(true));
  train(sgd_fresh, sgd_restarted, 2, 4);
  CHECK(all_same_bits(sgd_restarted, sgd_straight));
}

TEST_CASE("LibTorch's AdamW and SGD checkpoints load into the fused optimizers, and back",
          "[optim]") {
  // LibTorch -> amp: the state maps one to one (an int64 step becomes the float32 count).
  auto ref_params = make_params(9);
  torch::optim::AdamW libtorch(ref_params, torch::optim::AdamWOptions(0.01).amsgrad(true));
  train(libtorch, ref_params, 0, 4);
  auto params = clones(ref_params);
  FusedAdamW fused(params, FusedAdamWOptions(0.3));
  load_into(fused, saved(libtorch));
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& theirs = static_cast<const torch::optim::AdamWParamState&>(
        *libtorch.state().at(ref_params[i].unsafeGetTensorImpl()));
    const auto& ours =
        static_cast<const FusedAdamParamState&>(*fused.state().at(params[i].unsafeGetTensorImpl()));
    CHECK(ours.step().item<float>() == static_cast<float>(theirs.step()));
    CHECK(same_bits(ours.exp_avg(), theirs.exp_avg()));
    CHECK(same_bits(ours.exp_avg_sq(), theirs.exp_avg_sq()));
    CHECK(same_bits(ours.max_exp_avg_sq(), theirs.max_exp_avg_sq()));
  }
  CHECK(static_cast<const FusedAdamWOptions&>(fused.param_groups()[0].options()).lr() == 0.01);
  // The next steps continue LibTorch's run (to float32 rounding: the kernels differ).
  train_both(libtorch, ref_params, fused, params, 4, 7);

  // amp -> LibTorch: LibTorch's reader takes amp's archive.
  auto back = clones(params);
  torch::optim::AdamW libtorch_again(back, torch::optim::AdamWOptions(0.3));
  load_into(libtorch_again, saved(fused));
  const auto& theirs = static_cast<const torch::optim::AdamWParamState&>(
      *libtorch_again.state().at(back[1].unsafeGetTensorImpl()));
  const auto& ours =
      static_cast<const FusedAdamParamState&>(*fused.state().at(params[1].unsafeGetTensorImpl()));
  CHECK(theirs.step() == 7);
  CHECK(same_bits(theirs.exp_avg(), ours.exp_avg()));

  auto sgd_ref = make_params(10);
  torch::optim::SGD libtorch_sgd(sgd_ref, torch::optim::SGDOptions(0.05).momentum(0.9));
  train(libtorch_sgd, sgd_ref, 0, 2);
  auto sgd_params = clones(sgd_ref);
  FusedSGD fused_sgd(sgd_params, FusedSGDOptions(1.0));
  load_into(fused_sgd, saved(libtorch_sgd));
  const auto& buf = static_cast<const amp::optim::FusedSGDParamState&>(
      *fused_sgd.state().at(sgd_params[0].unsafeGetTensorImpl()));
  const auto& ref_buf = static_cast<const torch::optim::SGDParamState&>(
      *libtorch_sgd.state().at(sgd_ref[0].unsafeGetTensorImpl()));
  CHECK(same_bits(buf.momentum_buffer(), ref_buf.momentum_buffer()));
  CHECK(static_cast<const FusedSGDOptions&>(fused_sgd.param_groups()[0].options()).momentum() ==
        0.9);
}

TEST_CASE("Options out of range are refused with the option, the value and the fix", "[optim]") {
  auto params = make_params(11);
  CHECK_THROWS_WITH(FusedAdamW(params, FusedAdamWOptions(-1.0)),
                    Contains("lr must be finite and >= 0. Got lr=-1"));
  CHECK_THROWS_WITH(FusedAdam(params, FusedAdamOptions().betas({1.0, 0.999})),
                    Contains("betas[0] must be in [0, 1). Got betas[0]=1"));
  CHECK_THROWS_WITH(FusedAdam(params, FusedAdamOptions().betas({0.9, -0.1})),
                    Contains("betas[1] must be in [0, 1)"));
  CHECK_THROWS_WITH(FusedAdamW(params, FusedAdamWOptions().eps(std::nan(""))),
                    Contains("eps must be finite and >= 0"));
  CHECK_THROWS_WITH(FusedAdamW(params, FusedAdamWOptions().weight_decay(-0.1)),
                    Contains("weight_decay must be finite and >= 0. Got weight_decay=-0.1"));
  CHECK_THROWS_WITH(FusedSGD(params, FusedSGDOptions(0.1).nesterov(true)),
                    Contains("Nesterov momentum requires a momentum and zero dampening"));
  CHECK_THROWS_WITH(FusedSGD(params, FusedSGDOptions(0.1).momentum(-1)),
                    Contains("momentum must be finite and >= 0"));
  // A group's options are checked too, naming the group.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0]});
  groups.emplace_back(std::vector<torch::Tensor>{params[1]},
                      std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(-2.0)));
  CHECK_THROWS_WITH(FusedAdamW(groups, FusedAdamWOptions()),
                    Contains("FusedAdamW (param group 1): lr must be finite"));
  // And at step(), after a change through the options.
  FusedAdamW opt(params, FusedAdamWOptions());
  opt.param_groups()[0].options().set_lr(-0.5);
  set_grads(params, 0);
  const auto before = clones(params);
  CHECK_THROWS_WITH(opt.step(), Contains("lr must be finite and >= 0. Got lr=-0.5"));
  CHECK(all_same_bits(params, before));
}

TEST_CASE("Parameters and gradients the fused kernels cannot take are refused", "[optim]") {
  auto ints = std::vector<torch::Tensor>{torch::zeros({3}, torch::kLong)};
  CHECK_THROWS_WITH(FusedAdamW(ints, FusedAdamWOptions()),
                    Contains("parameter 0 of group 0 has dtype Long"));
  auto meta = std::vector<torch::Tensor>{torch::zeros({3}, torch::device(torch::kMeta))};
  CHECK_THROWS_WITH(FusedSGD(meta, FusedSGDOptions(0.1)),
                    Contains("amp's fused optimizers run on CPU and CUDA"));
  auto cpu = make_params(12);
  CHECK_THROWS_WITH(FusedAdamW(cpu, FusedAdamWOptions().capturable(true)),
                    Contains("capturable(true) keeps the step state on the device"));

  // Sparse gradients, as Python's fused optimizers refuse them; nothing is updated.
  auto emb = torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true));
  FusedAdam adam(emb->parameters(), FusedAdamOptions());
  emb->forward(torch::tensor({1, 2}, torch::kLong)).sum().backward();
  REQUIRE(emb->weight.grad().is_sparse());
  const auto before = emb->weight.detach().clone();
  CHECK_THROWS_WITH(adam.step(), Contains("the gradient of parameter 0 of group 0 is sparse"));
  CHECK(same_bits(emb->weight.detach(), before));
  CHECK(adam.state().empty());

  // A gradient of another dtype or shape than its parameter.
  auto p = make_params(13);
  FusedSGD sgd(p, FusedSGDOptions(0.1));
  p[0].mutable_grad() = torch::ones({5, 3}, torch::kDouble);
  CHECK_THROWS_WITH(sgd.step(), Contains("a gradient must match its parameter"));
}

TEST_CASE("A checkpoint that does not fit is refused and leaves the optimizer unchanged",
          "[optim]") {
  auto params = make_params(14);
  FusedAdamW opt(params, FusedAdamWOptions(0.01));
  train(opt, params, 0, 2);
  const std::string before = saved(opt);
  const auto expect_unchanged = [&] {
    CHECK(saved(opt) == before);
    CHECK(static_cast<const FusedAdamWOptions&>(opt.param_groups()[0].options()).lr() == 0.01);
  };

  // Another model: same number of parameters, another shape.
  auto other = std::vector<torch::Tensor>{torch::zeros({2, 2}).requires_grad_(true),
                                          torch::zeros({7}).requires_grad_(true),
                                          torch::zeros({}).requires_grad_(true)};
  FusedAdamW other_opt(other, FusedAdamWOptions(0.7));
  train(other_opt, other, 0, 1);
  CHECK_THROWS_WITH(load_into(opt, saved(other_opt)),
                    Contains("the state of parameter 0 of group 0 has exp_avg of Float [2, 2]"));
  expect_unchanged();

  // Another number of parameters, another number of groups.
  auto two = std::vector<torch::Tensor>{params[0].detach().clone().requires_grad_(true),
                                        params[1].detach().clone().requires_grad_(true)};
  FusedAdamW two_opt(two, FusedAdamWOptions(0.9));
  CHECK_THROWS_WITH(load_into(opt, saved(two_opt)),
                    Contains("group 0 of the checkpoint has 2 parameters but this optimizer's "
                             "group 0 has 3"));
  expect_unchanged();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{two[0]});
  groups.emplace_back(std::vector<torch::Tensor>{two[1]});
  FusedAdamW grouped(groups, FusedAdamWOptions(0.9));
  CHECK_THROWS_WITH(load_into(opt, saved(grouped)),
                    Contains("the checkpoint has 2 parameter groups"));
  expect_unchanged();

  // An SGD checkpoint is not an Adam one; options out of range in a file are refused too.
  auto sgd_params = clones(params);
  FusedSGD sgd(sgd_params, FusedSGDOptions(0.1).momentum(0.9));
  train(sgd, sgd_params, 0, 1);
  CHECK_THROWS_WITH(load_into(opt, saved(sgd)), Contains("not a readable FusedAdamW checkpoint"));
  expect_unchanged();
  auto bad_params = clones(params);
  FusedAdamW bad(bad_params, FusedAdamWOptions(0.01));
  bad.param_groups()[0].options().set_lr(-3.0);
  CHECK_THROWS_WITH(load_into(opt, saved(bad)),
                    Contains("FusedAdamW::load (param group 0): lr must be finite and >= 0"));
  expect_unchanged();
}

TEST_CASE("add_param_group keeps the group's own options and checks its parameters", "[optim]") {
  // Progressive unfreezing: a backbone group added later with its own lr and weight decay.
  auto params = make_params(21);
  FusedAdamW opt({params[0]}, FusedAdamWOptions(0.02).betas({0.8, 0.99}));
  opt.add_param_group(torch::optim::OptimizerParamGroup(
      {params[1]},
      std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(0.002).weight_decay(0.5))));
  opt.add_param_group(torch::optim::OptimizerParamGroup({params[2]}));
  REQUIRE(opt.param_groups().size() == 3);
  const auto& added = static_cast<const FusedAdamWOptions&>(opt.param_groups()[1].options());
  CHECK(added.lr() == 0.002);
  CHECK(added.weight_decay() == 0.5);
  CHECK(added.betas() == std::make_tuple(0.8, 0.99));  // left unset: the optimizer's default
  const auto& plain = static_cast<const FusedAdamWOptions&>(opt.param_groups()[2].options());
  CHECK(plain.lr() == 0.02);

  // It steps as a one-group optimizer with those options would.
  require_steps_as_alone(opt, params, 1,
                         FusedAdamWOptions(0.002).betas({0.8, 0.99}).weight_decay(0.5));

  // The low-precision options of an added group are kept too.
  auto bf16 = make_params(22, torch::kBFloat16);
  FusedSGD sgd({make_params(23)[0]}, FusedSGDOptions(0.1));
  sgd.add_param_group(torch::optim::OptimizerParamGroup(
      {bf16[0]}, std::make_unique<FusedSGDOptions>(FusedSGDOptions(0.1).kahan_summation(true))));
  CHECK(static_cast<const FusedSGDOptions&>(sgd.param_groups()[1].options()).kahan_summation());

  // The checks of the constructor, as sentences; a refused group is not added.
  CHECK_THROWS_WITH(
      opt.add_param_group(torch::optim::OptimizerParamGroup(
          {make_params(24)[0]}, std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(-1.0)))),
      Contains("FusedAdamW (param group 3): lr must be finite and >= 0. Got lr=-1"));
  CHECK_THROWS_WITH(
      opt.add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({2}, torch::kLong)})),
      Contains("parameter 0 of group 3 has dtype Long"));
  CHECK_THROWS_WITH(opt.add_param_group(torch::optim::OptimizerParamGroup(
                        {make_params(25)[0]}, std::make_unique<torch::optim::AdamWOptions>(0.1))),
                    Contains("the options of param group 3 are not FusedAdamWOptions"));
  // A float32 group under a low-precision option is accepted (the option acts on bf16/fp16
  // parameters only); an optimizer with no bf16/fp16 parameter at all is refused.
  CHECK_NOTHROW(sgd.add_param_group(torch::optim::OptimizerParamGroup(
      {make_params(26)[0]},
      std::make_unique<FusedSGDOptions>(FusedSGDOptions(0.1).kahan_summation(true)))));
  FusedSGD float32_only({make_params(27)[0]}, FusedSGDOptions(0.1));
  CHECK_THROWS_WITH(float32_only.add_param_group(torch::optim::OptimizerParamGroup(
                        {make_params(28)[0]}, std::make_unique<FusedSGDOptions>(
                                                  FusedSGDOptions(0.1).kahan_summation(true)))),
                    Contains("none of the optimizer's parameters is one (they are Float)"));
  CHECK(opt.param_groups().size() == 3);
  CHECK(sgd.param_groups().size() == 3);
  CHECK(float32_only.param_groups().size() == 1);
}

TEST_CASE("A group added through LibTorch's base class is refused at the next step", "[optim]") {
  // torch::optim::Optimizer::add_param_group is not virtual: called through a base reference it
  // replaces amp's options with the defaults. The step says so instead of training with them.
  auto params = make_params(27);
  FusedAdamW opt({params[0]}, FusedAdamWOptions(0.02));
  torch::optim::Optimizer& base = opt;
  base.add_param_group(torch::optim::OptimizerParamGroup(
      {params[1]}, std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(0.5))));
  set_grads(params, 0);
  const auto before = params[0].detach().clone();
  CHECK_THROWS_WITH(opt.step(), Contains("FusedAdamW: param group 1 was added through "
                                         "torch::optim::Optimizer::add_param_group") &&
                                    Contains("call add_param_group on the FusedAdamW itself"));
  CHECK(same_bits(params[0].detach(), before));  // nothing stepped
}

TEST_CASE("A parameter listed twice is stepped once, and one in two groups is refused", "[optim]") {
  // LibTorch's Module::parameters() lists a submodule registered under two names twice (Python's
  // deduplicates). Stepping it twice would apply two updates (and race on CUDA).
  auto shared = torch::nn::Linear(3, 2);
  auto model = std::make_shared<torch::nn::Module>();
  model->register_module("a", shared);
  model->register_module("b", shared);
  auto listed = model->parameters();
  REQUIRE(listed.size() == 4);  // weight, bias, weight, bias
  auto once = clones({shared->weight, shared->bias});

  FusedAdamW twice_listed(listed, FusedAdamWOptions(0.1));
  FusedAdamW reference(once, FusedAdamWOptions(0.1));
  CHECK(twice_listed.param_groups()[0].params().size() == 2);
  for (int k = 0; k < 3; ++k) {
    set_grads(once, k);
    shared->weight.mutable_grad() = once[0].grad().clone();
    shared->bias.mutable_grad() = once[1].grad().clone();
    twice_listed.step();
    reference.step();
  }
  CHECK(same_bits(shared->weight.detach(), once[0].detach()));
  CHECK(same_bits(shared->bias.detach(), once[1].detach()));

  // In two groups: which options would apply is ambiguous, as in Python, which refuses it too.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{shared->weight});
  groups.emplace_back(std::vector<torch::Tensor>{shared->bias, shared->weight});
  CHECK_THROWS_WITH(FusedSGD(groups, FusedSGDOptions(0.1)),
                    Contains("FusedSGD: parameter 1 of group 1 is also parameter 0 of group 0") &&
                        Contains("List each parameter in one group only"));
  FusedSGD sgd({shared->weight}, FusedSGDOptions(0.1));
  CHECK_THROWS_WITH(sgd.add_param_group(torch::optim::OptimizerParamGroup({shared->weight})),
                    Contains("parameter 0 of group 1 is also parameter 0 of group 0"));
}
