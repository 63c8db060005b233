// amp::optim::Adam and AdamW: Python's torch.optim.Adam / AdamW unfused steps bit for bit (float32,
// complex64 and bfloat16 parameters, amsgrad, decoupled and L2 weight decay, a parameter without a
// gradient), against unfused_adam_reference.py in the venv; and their option checks.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <amp/optim/unfused_adam.h>
#include <amp/state_dict.h>

#include "support/python_rows.h"

using Catch::Contains;

namespace {

using Rows = std::vector<std::vector<std::string>>;

// The script's params(): the same seeds give the same values in both languages.
std::vector<at::Tensor> params() {
  torch::manual_seed(5);
  std::vector<at::Tensor> out = {torch::randn({3, 4}), torch::randn({5}, torch::kComplexFloat),
                                 torch::randn({6}).to(torch::kBFloat16)};
  for (auto& p : out) p.requires_grad_(true);
  return out;
}

// The script's grads(step, ps).
std::vector<at::Tensor> grads(int step, const std::vector<at::Tensor>& ps) {
  torch::manual_seed(100 + step);
  std::vector<at::Tensor> out;
  for (const auto& p : ps) {
    out.push_back(p.scalar_type() == torch::kBFloat16 ? torch::randn(p.sizes()).to(torch::kBFloat16)
                                                      : torch::randn(p.sizes(), p.scalar_type()));
  }
  if (step == 3) out[1] = at::Tensor();
  return out;
}

template <typename Optimizer, typename Options>
Rows five_steps(bool amsgrad) {
  auto ps = params();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{ps[0], ps[1]});
  groups.emplace_back(std::vector<at::Tensor>{ps[2]},
                      std::make_unique<Options>(
                          Options(0.05).betas({0.8, 0.95}).weight_decay(0.2).amsgrad(amsgrad)));
  Optimizer optimizer(groups, Options(0.01).betas({0.8, 0.95}).weight_decay(0.1).amsgrad(amsgrad));
  for (int step = 1; step <= 5; ++step) {
    const auto g = grads(step, ps);
    for (std::size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = g[i];
    optimizer.step();
  }
  Rows out;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    out.push_back(amp_test::tensor_row("param." + std::to_string(i), ps[i]));
  }
  // Python's names and index order; the step count becomes Python's float tensor.
  const auto state = amp::optimizer_state_dict(optimizer).toGenericDict().at("state");
  for (const auto& entry : state.toGenericDict()) {
    for (const auto& field : entry.value().toGenericDict()) {
      out.push_back(amp_test::tensor_row(
          "state." + std::to_string(entry.key().toInt()) + "." + field.key().toStringRef(),
          field.value().toTensor()));
    }
  }
  return out;
}

// The script's rows of run `name` ("adamw", "adam" or "adamw_foreach"), the prefix taken off.
Rows run_rows(const Rows& all, const std::string& name) {
  Rows out;
  for (const auto& row : all) {
    if (row[0].starts_with(name + "/")) {
      out.push_back(row);
      out.back()[0] = row[0].substr(name.size() + 1);
    }
  }
  return out;
}

Rows sorted(Rows rows) {
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace

TEST_CASE("amp::optim::Adam and AdamW take Python's unfused steps bit for bit",
          "[optim][unfused][python]") {
  const bool amsgrad = GENERATE(false, true);
  CAPTURE(amsgrad);
  const Rows adamw = sorted(five_steps<amp::optim::AdamW, torch::optim::AdamWOptions>(amsgrad));
  const Rows adam = sorted(five_steps<amp::optim::Adam, torch::optim::AdamOptions>(amsgrad));
  const Rows python = amp_test::python_rows(
      AMP_TEST_PYTHON, AMP_TEST_SOURCE_DIR "/optim/unfused_adam_reference.py", amsgrad ? "1" : "0");
  // Python's single-tensor path (its CPU default).
  CHECK(adamw == sorted(run_rows(python, "adamw")));
  CHECK(adam == sorted(run_rows(python, "adam")));
  // Its foreach path gives the same bits for float32 and complex parameters; for bfloat16 ones
  // its _foreach_mul_ rounds the decay factors to bfloat16 first, so those rows are left out.
  const auto without_bf16 = [](const Rows& rows) {
    Rows out;
    std::copy_if(rows.begin(), rows.end(), std::back_inserter(out),
                 [](const auto& row) { return row[1] != "bfloat16"; });
    return out;
  };
  CHECK(without_bf16(adamw) == without_bf16(sorted(run_rows(python, "adamw_foreach"))));
  // The rows cover every tensor: 3 parameters, 3 states of 3 (or 4, amsgrad) entries.
  CHECK(adamw.size() == (amsgrad ? 15u : 12u));
}

TEST_CASE("amp::optim::Adam and AdamW refuse bad options with a sentence", "[optim][unfused]") {
  const auto ps = params();
  CHECK_THROWS_WITH(amp::optim::AdamW({ps[0]}, torch::optim::AdamWOptions(-1.0)),
                    Contains("amp::optim::AdamW: lr must be finite and >= 0. Got lr=-1; pass a "
                             "learning rate such as 1e-3."));
  CHECK_THROWS_WITH(amp::optim::Adam({ps[0]}, torch::optim::AdamOptions().betas({0.9, 1.0})),
                    Contains("amp::optim::Adam: betas[1] must be in [0, 1). Got betas[1]=1"));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{ps[0]});
  groups.emplace_back(std::vector<at::Tensor>{ps[2]}, std::make_unique<torch::optim::AdamWOptions>(
                                                          torch::optim::AdamWOptions().eps(-1)));
  CHECK_THROWS_WITH(amp::optim::AdamW(groups),
                    Contains("amp::optim::AdamW (param group 1): eps must be finite and >= 0"));
  std::vector<torch::optim::OptimizerParamGroup> other;
  other.emplace_back(std::vector<at::Tensor>{ps[0]},
                     std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1)));
  CHECK_THROWS_WITH(amp::optim::Adam(other),
                    Contains("amp::optim::Adam: the options of param group 0 are not "
                             "torch::optim::AdamOptions"));
  // A sparse gradient anywhere is refused before any parameter moves.
  amp::optim::AdamW sparse({ps[2], ps[0]});
  ps[2].mutable_grad() = torch::ones({6}).to(torch::kBFloat16);
  ps[0].mutable_grad() = torch::ones({3, 4}).to_sparse();
  const at::Tensor before = ps[2].detach().clone();
  CHECK_THROWS_WITH(sparse.step(), Contains("amp::optim::AdamW (param group 0): parameter 1 has a "
                                            "sparse gradient, which Adam cannot use"));
  CHECK(torch::equal(ps[2], before));
  CHECK(sparse.state().empty());
}
