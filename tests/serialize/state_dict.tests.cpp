// amp::load_state_dict / save_state_dict and amp::load_pickled / save_pickled: Python's
// torch.save files read bit for bit into LibTorch modules, amp's files read by Python's
// torch.load(weights_only=True), and other models' files, wrong shapes and dtypes, and damaged
// or hostile files refused with the module unchanged. Python (state_dict_reference.py) is the
// reference on both sides.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <amp/fp8.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>
#include <amp/state_dict.h>

#include "serialize/zip_edit.h"
#include "support/python_rows.h"
#include "support/temp_dir.h"

using Catch::Contains;

namespace {

const std::string kScript = AMP_TEST_SOURCE_DIR "/serialize/state_dict_reference.py";

std::vector<std::vector<std::string>> python(const std::string& args) {
  return amp_test::python_rows(AMP_TEST_PYTHON, kScript, args);
}

std::string quoted(const std::filesystem::path& path) { return "\"" + path.string() + "\""; }

// lion-pytorch's step is ATen's lerp_, whose scalar CPU loop (ATEN_CPU_CAPABILITY=default)
// rounds otherwise than its AVX2 and AVX-512 loops (measured); FusedLion's rule gives the
// vectorised loops' bits whatever the capability. While it lives, the reference runs on the
// machine's own capability, as a user's Python does.
class ReferenceOnOwnCpuLoops {
 public:
  explicit ReferenceOnOwnCpuLoops(bool active) {
    const char* set = std::getenv("ATEN_CPU_CAPABILITY");
    if (!active || set == nullptr) return;
    saved_ = set;
    ::unsetenv("ATEN_CPU_CAPABILITY");
  }
  ~ReferenceOnOwnCpuLoops() {
    if (saved_) ::setenv("ATEN_CPU_CAPABILITY", saved_->c_str(), 1);
  }
  ReferenceOnOwnCpuLoops(const ReferenceOnOwnCpuLoops&) = delete;
  ReferenceOnOwnCpuLoops& operator=(const ReferenceOnOwnCpuLoops&) = delete;

 private:
  std::optional<std::string> saved_;
};

std::vector<std::string> row(const std::string& key, const at::Tensor& tensor) {
  return amp_test::tensor_row(key, tensor);
}

std::vector<std::vector<std::string>> rows(const torch::nn::Module& module) {
  std::vector<std::vector<std::string>> out;
  for (const auto& entry : amp::state_dict(module)) out.push_back(row(entry.key(), entry.value()));
  return out;
}

// The script's "mlp": Linear, LayerNorm in bfloat16, Linear, BatchNorm1d, and a float8 and a
// float16 buffer on the Sequential itself. `hidden`/`out` change shapes for the mismatch cases.
torch::nn::Sequential mlp(int64_t out = 3, bool bf16_norm = true) {
  torch::manual_seed(11);
  torch::nn::Sequential m(torch::nn::Linear(4, 8),
                          torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})),
                          torch::nn::Linear(8, out), torch::nn::BatchNorm1d(out));
  if (bf16_norm) m[1]->to(torch::kBFloat16);
  m->register_buffer("history", torch::randn({5}).to(torch::kFloat8_e4m3fn));
  m->register_buffer("half_buffer", torch::randn({2, 3}).to(torch::kHalf));
  return m;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST_CASE("A state dict saved by Python loads into the same model built in LibTorch, bit for bit",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "mlp.pt";
  const auto expected = python("write mlp " + quoted(path));
  auto model = mlp();
  const amp::StateDictKeys keys = amp::load_state_dict(*model, path.string());
  CHECK(keys.missing_keys.empty());
  CHECK(keys.unexpected_keys.empty());
  // Every entry (float32, bfloat16, float16, float8, the int64 counter) in Python's order.
  CHECK(rows(*model) == expected);
  REQUIRE(expected.size() == 13);
  CHECK(expected[0][0] == "history");
  CHECK(expected.back()[0] == "3.num_batches_tracked");
}

TEST_CASE("A data-parallel Python run's state dict loads once its module. prefix is consumed",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "ddp.pt";
  // The script's "other" model (Gloo cannot broadcast mlp's float8 buffer).
  const auto expected = python("ddp-write other " + quoted(path));
  REQUIRE(expected.size() == 3);
  CHECK(expected[0][0] == "module.extra");  // the Sequential's own buffer, then its child
  torch::nn::Sequential model(torch::nn::Linear(4, 8));
  model->register_buffer("extra", torch::ones({2}));
  const auto before = rows(*model);
  c10::IValue state = amp::load_pickled(path.string());
  // As saved, every name is under "module.": a strict load lists them and changes nothing.
  CHECK_THROWS_WITH(amp::load_state_dict(*model, state),
                    Contains("Unexpected key(s): \"module.extra\", \"module.0.weight\", "
                             "\"module.0.bias\"."));
  CHECK(rows(*model) == before);
  amp::consume_prefix_in_state_dict_if_present(state, "module.");
  amp::load_state_dict(*model, state);
  // Python's entries in Python's order, each under its plain name, bit for bit.
  auto plain = expected;
  for (auto& row : plain) row[0] = row[0].substr(std::string("module.").size());
  CHECK(rows(*model) == plain);
  // A prefix no key has changes nothing; a value that is no dict is refused with a sentence.
  c10::IValue again = amp::state_dict(*model);
  amp::consume_prefix_in_state_dict_if_present(again, "_orig_mod.");
  CHECK(again.toGenericDict().size() == 3);
  CHECK(again.toGenericDict().contains("extra"));
  c10::IValue number(int64_t{3});
  CHECK_THROWS_WITH(amp::consume_prefix_in_state_dict_if_present(number, "module."),
                    Contains("consume_prefix_in_state_dict_if_present: the state is a Int, not a "
                             "state dict"));
}

TEST_CASE("A state dict saved by amp loads in Python with weights_only=True, bit for bit",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "mlp.pt";
  auto model = mlp();
  {
    torch::NoGradGuard no_grad;
    model[3]->named_buffers()["num_batches_tracked"].fill_(9);
    model[3]->named_buffers()["running_var"].uniform_(1, 2);
  }
  amp::save_state_dict(*model, path.string());
  CHECK_FALSE(std::filesystem::exists(path.string() + ".partial"));
  // Python loads it strictly into its own model and prints that model's state.
  CHECK(python("read mlp " + quoted(path)) == rows(*model));
  // And amp reads back what it wrote.
  auto again = mlp(3);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : again->parameters()) p.zero_();
  }
  amp::load_state_dict(*again, path.string());
  CHECK(rows(*again) == rows(*model));
}

TEST_CASE("A file of another model is refused with its missing and unexpected keys",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "other.pt";
  python("write other " + quoted(path));
  auto model = mlp();
  const auto before = rows(*model);
  CHECK_THROWS_WITH(
      amp::load_state_dict(*model, path.string()),
      Contains("'" + path.string() +
               "': load_state_dict: the state does not match the module's "
               "names. Missing key(s): \"history\", \"half_buffer\", \"1.weight\"") &&
          Contains("\"3.running_var\". Unexpected key(s): \"extra\". Pass strict = false"));
  CHECK(rows(*model) == before);

  // Not strict: what matches is loaded, and the keys are returned as Python returns them.
  const amp::StateDictKeys keys = amp::load_state_dict(*model, path.string(), /*strict=*/false);
  CHECK(keys.unexpected_keys == std::vector<std::string>{"extra"});
  // The file's _metadata has no version for module 3, so its BatchNorm keeps its own
  // num_batches_tracked, as Python's (10 missing keys there too).
  CHECK(keys.missing_keys.size() == 10);
  CHECK(keys.missing_keys.back() == "3.running_var");
  CHECK(keys.missing_keys.front() == "history");
  const auto after = rows(*model);
  CHECK(after[2] != before[2]);  // 0.weight: Python's
  CHECK(std::vector(after.begin() + 4, after.end()) ==
        std::vector(before.begin() + 4, before.end()));
}

TEST_CASE("A shape or dtype that differs is refused naming the key, the module unchanged",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "mlp.pt";
  python("write mlp " + quoted(path));
  SECTION("shape") {
    auto model = mlp(/*out=*/4);
    const auto before = rows(*model);
    CHECK_THROWS_WITH(amp::load_state_dict(*model, path.string(), /*strict=*/false),
                      Contains("load_state_dict: size mismatch for 2.weight: the state has shape "
                               "[3, 8], the module's is [4, 8]"));
    CHECK(rows(*model) == before);
  }
  SECTION("dtype") {
    auto model = mlp(3, /*bf16_norm=*/false);
    const auto before = rows(*model);
    CHECK_THROWS_WITH(amp::load_state_dict(*model, path.string()),
                      Contains("load_state_dict: dtype mismatch for 1.weight: the state has "
                               "BFloat16, the module's is Float; convert the module"));
    CHECK(rows(*model) == before);
  }
}

TEST_CASE("Damaged and hostile state files are refused with a sentence, the module unchanged",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "mlp.pt";
  python("write mlp " + quoted(path));
  const std::string good = read_file(path);
  auto model = mlp();
  const auto before = rows(*model);
  const auto bad = dir.path() / "bad.pt";
  const auto refused = [&](const std::string& bytes) {
    write_file(bad, bytes);
    std::string message;
    try {
      amp::load_state_dict(*model, bad.string());
    } catch (const c10::Error& error) {
      message = error.msg();
    }
    CHECK(rows(*model) == before);
    return message;
  };
  // A pickle that imports something else than torch.save writes (same length, CRC fixed).
  CHECK_THAT(refused(amp_test::edit_entry(good, "/data.pkl", "collections\nOrderedDict",
                                          "subprocess\nPopen_orders")),
             Contains("cannot read '" + bad.string() +
                      "': not a file torch.save writes, or "
                      "damaged: ") &&
                 Contains("GLOBAL imports 'subprocess'.'Popen_orders'"));
  CHECK_THAT(
      refused(amp_test::edit_entry(good, "/data.pkl", "_rebuild_tensor_v2", "_rebuild_parameter")),
      Contains("_rebuild_parameter"));
  // A float8 tensor's untyped storage read as v2, and a typed one's arguments read as v3.
  CHECK_THAT(
      refused(amp_test::edit_entry(good, "/data.pkl", "_rebuild_tensor_v3", "_rebuild_tensor_v2")),
      Contains("_rebuild_tensor_v2's storage is untyped"));
  CHECK_THAT(
      refused(amp_test::edit_entry(good, "/data.pkl", "_rebuild_tensor_v2", "_rebuild_tensor_v3")),
      Contains("_rebuild_tensor_v3 is called with a tuple rather than a tuple of 7 or 8 "
               "arguments"));
  // Truncated, and a tensor's bytes changed without their CRC.
  CHECK_THAT(refused(good.substr(0, good.size() / 2)), Contains("cannot read '" + bad.string()));
  std::string flipped = good;
  for (const auto& entry : amp::detail::read_zip_directory(good, 0xfffe)) {
    if (entry.name == "mlp/data/2") flipped[entry.data_offset + 5] ^= 0x40;  // 0.weight
  }
  REQUIRE(flipped != good);
  CHECK_THAT(refused(flipped), Contains("cannot read '" + bad.string()) && Contains("CRC"));
  // Not a file at all.
  CHECK_THROWS_WITH(amp::load_state_dict(*model, (dir.path() / "none.pt").string()),
                    Contains("cannot open"));
}

TEST_CASE("Python's optimizer state_dict reads as values: state by index, param_groups",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "adamw.pt";
  const auto expected = python("optimizer " + quoted(path));
  const c10::IValue value = amp::load_pickled(path.string());
  REQUIRE(value.isGenericDict());
  const auto dict = value.toGenericDict();
  const auto state = dict.at("state").toGenericDict();
  const auto groups = dict.at("param_groups").toList();
  std::vector<std::vector<std::string>> seen;
  for (const auto& index : state) {
    for (const auto& entry : index.value().toGenericDict()) {
      seen.push_back(
          row("state." + std::to_string(index.key().toInt()) + "." + entry.key().toStringRef(),
              entry.value().toTensor()));
    }
  }
  REQUIRE(groups.size() == 2);
  const auto group1 = groups.get(1).toGenericDict();
  CHECK(group1.at("lr").toDouble() == 0.5);
  CHECK(group1.at("betas").toTupleRef().elements()[1].toDouble() == 0.95);
  CHECK(group1.at("amsgrad").toBool() == false);
  CHECK(group1.at("foreach").isNone());
  CHECK(group1.at("params").toList().get(0).toInt() == 1);
  // The tensor rows are Python's, in its order.
  const std::vector<std::vector<std::string>> expected_tensors(expected.begin(),
                                                               expected.begin() + seen.size());
  CHECK(seen == expected_tensors);
}

TEST_CASE("save_pickled writes values Python reads with weights_only=True, and load_pickled reads",
          "[serialize][state_dict][python]") {
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "values.pt";
  c10::impl::GenericDict by_index(c10::IntType::get(), c10::AnyType::get());
  by_index.insert(int64_t{0}, 1.5);
  by_index.insert(int64_t{7}, std::string("seven"));
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{1});
  list.push_back(int64_t{-70000});
  torch::manual_seed(2);
  const at::Tensor matrix = torch::randn({3, 4});
  c10::impl::GenericDict value(c10::StringType::get(), c10::AnyType::get());
  value.insert("by_index", by_index);
  value.insert("tuple", c10::ivalue::Tuple::create({c10::IValue(int64_t{1} << 40), c10::IValue(),
                                                    c10::IValue(true), c10::IValue(-0.25)}));
  value.insert("list", list);
  value.insert("transposed", matrix.t());  // a view: written contiguous
  value.insert("bf16", torch::randn({5}).to(torch::kBFloat16));
  value.insert("fp8", torch::randn({2, 2}).to(torch::kFloat8_e5m2));
  amp::save_pickled(value, path.string());

  const auto printed = python("values " + quoted(path));
  REQUIRE(printed.size() == 6);
  CHECK(printed[0] == std::vector<std::string>{"by_index", "{0: 1.5, 7: 'seven'}"});
  CHECK(printed[1] == std::vector<std::string>{"tuple", "(1099511627776, None, True, -0.25)"});
  CHECK(printed[2] == std::vector<std::string>{"list", "[1, -70000]"});
  CHECK(printed[3] == row("transposed", matrix.t()));
  CHECK(printed[4] == row("bf16", value.at("bf16").toTensor()));
  CHECK(printed[5] == row("fp8", value.at("fp8").toTensor()));

  const c10::IValue back = amp::load_pickled(path.string());
  const auto read = back.toGenericDict();
  CHECK(read.at("by_index").toGenericDict().at(int64_t{7}).toStringRef() == "seven");
  CHECK(read.at("list").toList().get(1).toInt() == -70000);
  CHECK(read.at("tuple").toTupleRef().elements()[0].toInt() == int64_t{1} << 40);
  CHECK(torch::equal(read.at("transposed").toTensor(), matrix.t()));
  CHECK(row("fp8", read.at("fp8").toTensor()) == printed[5]);

  // What Python's files cannot hold outside a pickled class is refused, naming it.
  c10::impl::GenericDict odd(c10::StringType::get(), c10::AnyType::get());
  odd.insert("device", c10::IValue(c10::Device(c10::kCPU)));
  CHECK_THROWS_WITH(amp::save_pickled(odd, (dir.path() / "odd.pt").string()),
                    Contains("the value[device] is a Device"));
}

TEST_CASE("Float8 layers' delayed histories and scales travel in the state dict",
          "[serialize][state_dict][fp8]") {
  using namespace amp::fp8;
  const auto make = [] {
    torch::manual_seed(5);
    return torch::nn::Sequential(
        Float8Linear(Float8LinearOptions(16, 16).recipe(Recipe::delayed())),
        Float8Linear(Float8LinearOptions(16, 8).recipe(Recipe::delayed())));
  };
  auto trained = make();
  {
    Float8AutocastGuard float8;
    for (int step = 0; step < 3; ++step) {
      torch::manual_seed(100 + step);
      trained->forward(torch::randn({4, 16}) * (step + 1)).square().mean().backward();
    }
  }
  const auto saved = rows(*trained);
  bool has_history = false;
  for (const auto& r : saved) has_history = has_history || r[0] == "0.amax_history_input";
  CHECK(has_history);
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "fp8.pt";
  amp::save_state_dict(*trained, path.string());
  auto fresh = make();
  CHECK(rows(*fresh) != saved);
  amp::load_state_dict(*fresh, path.string());
  CHECK(rows(*fresh) == saved);
}

// ---- optimizers ----

namespace {

// The script's optimizer_for(kind): two groups over two parameters, the second with its own
// options; amp's fused optimizers against Python's fused ones, amp::optim::AdamW and LibTorch's SGD
// and AdamW against Python's single-tensor ones.
std::unique_ptr<torch::optim::Optimizer> optimizer_for(const std::string& kind,
                                                       const std::vector<at::Tensor>& params) {
  using torch::optim::OptimizerParamGroup;
  std::vector<OptimizerParamGroup> groups;
  if (kind == "adamw_fused" || kind == "adam_fused") {
    using amp::optim::FusedAdamOptions;
    using amp::optim::FusedAdamWOptions;
    groups.emplace_back(std::vector<at::Tensor>{params[0]});
    if (kind == "adam_fused") {
      groups.emplace_back(
          std::vector<at::Tensor>{params[1]},
          std::make_unique<FusedAdamOptions>(FusedAdamOptions(0.5).weight_decay(0.0)));
      return std::make_unique<amp::optim::FusedAdam>(
          std::move(groups),
          FusedAdamOptions(0.01).betas({0.8, 0.95}).weight_decay(0.01).amsgrad(true));
    }
    groups.emplace_back(
        std::vector<at::Tensor>{params[1]},
        std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(0.5).weight_decay(0.0)));
    return std::make_unique<amp::optim::FusedAdamW>(
        std::move(groups), FusedAdamWOptions(0.01).betas({0.8, 0.95}).weight_decay(0.01));
  }
  if (kind == "adamw" || kind == "adamw_libtorch") {
    using torch::optim::AdamWOptions;
    groups.emplace_back(std::vector<at::Tensor>{params[0]});
    groups.emplace_back(
        std::vector<at::Tensor>{params[1]},
        std::make_unique<AdamWOptions>(AdamWOptions(0.5).betas({0.8, 0.95}).weight_decay(0.0)));
    const auto defaults = AdamWOptions(0.01).betas({0.8, 0.95}).weight_decay(0.01);
    if (kind == "adamw") return std::make_unique<amp::optim::AdamW>(std::move(groups), defaults);
    return std::make_unique<torch::optim::AdamW>(std::move(groups), defaults);
  }
  groups.emplace_back(std::vector<at::Tensor>{params[0]});
  if (kind == "lion") {
    using amp::optim::FusedLionOptions;
    groups.emplace_back(
        std::vector<at::Tensor>{params[1]},
        std::make_unique<FusedLionOptions>(FusedLionOptions(0.5).weight_decay(0.0)));
    return std::make_unique<amp::optim::FusedLion>(
        std::move(groups), FusedLionOptions(0.01).betas({0.8, 0.95}).weight_decay(0.01));
  }
  if (kind == "sgd_fused") {
    using amp::optim::FusedSGDOptions;
    groups.emplace_back(std::vector<at::Tensor>{params[1]},
                        std::make_unique<FusedSGDOptions>(FusedSGDOptions(0.5).momentum(0.5)));
    return std::make_unique<amp::optim::FusedSGD>(
        std::move(groups), FusedSGDOptions(0.1).momentum(0.9).weight_decay(0.01));
  }
  REQUIRE(kind == "sgd");
  using torch::optim::SGDOptions;
  groups.emplace_back(
      std::vector<at::Tensor>{params[1]},
      std::make_unique<SGDOptions>(SGDOptions(0.5).momentum(0.5).weight_decay(0.01)));
  return std::make_unique<torch::optim::SGD>(std::move(groups),
                                             SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
}

std::vector<at::Tensor> tensors_of(const c10::IValue& list) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& item : list.toListRef()) out.push_back(item.toTensor());
  return out;
}

// What the script's "optimizer-resume adamw" writes into `dir`: Python's AdamW(foreach=False)
// after 2 steps ("optimizer"), its parameters ("params") and the next gradients.
c10::impl::GenericDict python_adamw_file(const amp_test::TempDir& dir) {
  const auto path = dir.path() / "adamw.pt";
  python("optimizer-resume adamw " + quoted(path));
  return amp::load_pickled(path.string()).toGenericDict();
}

// Fresh leaf copies of the parameters a script saved, for an optimizer to train.
std::vector<at::Tensor> trainable_copies(const c10::IValue& saved_params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : tensors_of(saved_params))
    out.push_back(p.clone().requires_grad_(true));
  return out;
}

void set_grads(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
}

// The parameters' and the state's rows, as the script prints them, sorted.
std::vector<std::vector<std::string>> optimizer_rows(const std::vector<at::Tensor>& params,
                                                     const torch::optim::Optimizer& optimizer) {
  std::vector<std::vector<std::string>> out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    out.push_back(row("param." + std::to_string(i), params[i]));
  }
  for (const auto& entry :
       amp::optimizer_state_dict(optimizer).toGenericDict().at("state").toGenericDict()) {
    for (const auto& field : entry.value().toGenericDict()) {
      if (!field.value().isTensor()) continue;
      out.push_back(
          row("state." + std::to_string(entry.key().toInt()) + "." + field.key().toStringRef(),
              field.value().toTensor()));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<std::string>> sorted(std::vector<std::vector<std::string>> rows) {
  std::sort(rows.begin(), rows.end());
  return rows;
}

// The rows a comparison of `kind` covers: lion-pytorch keeps no step count (FusedLion's file
// carries one through it unchanged), so its rows leave the counts out.
std::vector<std::vector<std::string>> compared(const std::string& kind,
                                               std::vector<std::vector<std::string>> rows) {
  if (kind == "lion") {
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [](const auto& row) { return row[0].ends_with(".step"); }),
               rows.end());
  }
  return sorted(std::move(rows));
}

}  // namespace

TEST_CASE("An optimizer's state saved by Python resumes in C++, the next step bit for bit",
          "[serialize][state_dict][optim][python]") {
  const std::string kind =
      GENERATE("adamw_fused", "adam_fused", "adamw", "sgd_fused", "sgd", "lion");
  CAPTURE(kind);
  amp_test::TempDir dir("optimizer_state");
  const auto path = dir.path() / "resume.pt";
  const ReferenceOnOwnCpuLoops own_loops(kind == "lion");
  const auto expected = python("optimizer-resume " + kind + " " + quoted(path));
  const auto saved = amp::load_pickled(path.string()).toGenericDict();
  std::vector<at::Tensor> params = trainable_copies(saved.at("params"));
  auto optimizer = optimizer_for(kind, params);
  // The options come from the file: different ones at construction are replaced.
  amp::load_optimizer_state_dict(*optimizer, saved.at("optimizer"));
  set_grads(params, tensors_of(saved.at("grad3")));
  optimizer->step();
  CHECK(compared(kind, optimizer_rows(params, *optimizer)) == compared(kind, expected));
}

TEST_CASE("An optimizer's state saved by amp resumes in Python, the next step bit for bit",
          "[serialize][state_dict][optim][python]") {
  const std::string kind =
      GENERATE("adamw_fused", "adam_fused", "adamw", "sgd_fused", "sgd", "lion");
  CAPTURE(kind);
  torch::manual_seed(21);
  std::vector<at::Tensor> params = {torch::randn({3, 2}).requires_grad_(true),
                                    torch::randn({4}).requires_grad_(true)};
  auto optimizer = optimizer_for(kind, params);
  const auto grads = [&](int step) {
    torch::manual_seed(200 + step);
    return std::vector<at::Tensor>{torch::randn({3, 2}), torch::randn({4})};
  };
  for (int step = 1; step <= 2; ++step) {
    set_grads(params, grads(step));
    optimizer->step();
  }
  c10::impl::GenericList saved_params(c10::TensorType::get()), grad3(c10::TensorType::get());
  for (const auto& p : params) saved_params.push_back(p.detach().clone());
  for (const auto& g : grads(3)) grad3.push_back(g);
  c10::impl::GenericDict file(c10::StringType::get(), c10::AnyType::get());
  file.insert("params", saved_params);
  file.insert("optimizer", amp::optimizer_state_dict(*optimizer));
  file.insert("grad3", grad3);
  amp_test::TempDir dir("optimizer_state");
  const auto path = dir.path() / "resume.pt";
  amp::save_pickled(file, path.string());
  set_grads(params, grads(3));
  optimizer->step();
  const ReferenceOnOwnCpuLoops own_loops(kind == "lion");
  CHECK(compared(kind, python("optimizer-continue " + kind + " " + quoted(path))) ==
        compared(kind, optimizer_rows(params, *optimizer)));
}

TEST_CASE("LibTorch's AdamW takes Python's AdamW state and a file of other groups is refused",
          "[serialize][state_dict][optim][python]") {
  amp_test::TempDir dir("optimizer_state");
  const auto path = dir.path() / "resume.pt";
  python("optimizer-resume adamw_libtorch " + quoted(path));
  const auto saved = amp::load_pickled(path.string()).toGenericDict();
  std::vector<at::Tensor> params = trainable_copies(saved.at("params"));
  auto optimizer = optimizer_for("adamw_libtorch", params);
  amp::load_optimizer_state_dict(*optimizer, saved.at("optimizer"));
  // The state and the options are Python's (LibTorch's AdamW step itself is not bit for bit
  // Python's unfused one, so no step is compared here; amp::optim::AdamW's is).
  const auto state = amp::optimizer_state_dict(*optimizer).toGenericDict();
  const auto python_state = saved.at("optimizer").toGenericDict();
  for (int64_t index : {0, 1}) {
    const auto mine = state.at("state").toGenericDict().at(index).toGenericDict();
    const auto theirs = python_state.at("state").toGenericDict().at(index).toGenericDict();
    for (const char* key : {"step", "exp_avg", "exp_avg_sq"}) {
      INFO(index << " " << key);
      CHECK(row(key, mine.at(key).toTensor()) == row(key, theirs.at(key).toTensor()));
    }
  }
  const auto group1 = state.at("param_groups").toList().get(1).toGenericDict();
  CHECK(group1.at("lr").toDouble() == 0.5);
  CHECK(group1.at("weight_decay").toDouble() == 0.0);

  // One parameter fewer in the second group: refused naming the group, amp's optimizer unchanged.
  auto fused = optimizer_for("adamw_fused", params);
  const auto before = optimizer_rows(params, *fused);
  auto fewer = python_state.copy();
  auto groups = fewer.at("param_groups").toList().copy();
  auto second = groups.get(1).toGenericDict().copy();
  second.insert_or_assign("params", c10::impl::GenericList(c10::IntType::get()));
  groups.set(1, second);
  fewer.insert_or_assign("param_groups", groups);
  CHECK_THROWS_WITH(amp::load_optimizer_state_dict(*fused, fewer),
                    Contains("group 1 of the checkpoint has 0 parameters but this optimizer's "
                             "group 1 has 1"));
  CHECK(optimizer_rows(params, *fused) == before);
  CHECK_THROWS_WITH(amp::load_optimizer_state_dict(*fused, c10::IValue(int64_t{3})),
                    Contains("load_optimizer_state_dict: it is a Int; the state is not an "
                             "optimizer's state_dict()"));
}

TEST_CASE("A state asking for an update the optimizer does not compute is refused naming the group",
          "[serialize][state_dict][optim][python]") {
  amp_test::TempDir dir("optimizer_state");
  const auto saved = python_adamw_file(dir);
  std::vector<at::Tensor> params = trainable_copies(saved.at("params"));
  const c10::IValue adamw_file = saved.at("optimizer");
  // Python writes decoupled_weight_decay=True for AdamW; an Adam (L2) optimizer refuses it.
  auto adam = optimizer_for("adam_fused", params);
  const auto before = optimizer_rows(params, *adam);
  CHECK_THROWS_WITH(
      amp::load_optimizer_state_dict(*adam, adamw_file),
      Contains("load_optimizer_state_dict: param group 0 of the state has "
               "decoupled_weight_decay=True (Python's AdamW) but amp::optim::FusedAdam's weight "
               "decay is L2 (Adam's); load it into FusedAdamW or amp::optim::AdamW. The optimizer "
               "is unchanged."));
  CHECK(optimizer_rows(params, *adam) == before);
  // maximize=True: LibTorch's classes cannot, amp's fused ones can.
  auto maximizing = adamw_file.toGenericDict().copy();
  auto groups = maximizing.at("param_groups").toList().copy();
  auto second = groups.get(1).toGenericDict().copy();
  second.insert_or_assign("maximize", true);
  groups.set(1, second);
  maximizing.insert_or_assign("param_groups", groups);
  auto unfused = optimizer_for("adamw", params);
  CHECK_THROWS_WITH(amp::load_optimizer_state_dict(*unfused, maximizing),
                    Contains("param group 1 of the state has maximize=True, which "
                             "amp::optim::AdamW cannot do"));
  auto fused = optimizer_for("adamw_fused", params);
  amp::load_optimizer_state_dict(*fused, maximizing);
  const auto written = amp::optimizer_state_dict(*fused).toGenericDict();
  CHECK(written.at("param_groups").toList().get(1).toGenericDict().at("maximize").toBool());
  // amp's files say which of Python's Adam and AdamW they are.
  CHECK(written.at("param_groups")
            .toList()
            .get(0)
            .toGenericDict()
            .at("decoupled_weight_decay")
            .toBool());
  CHECK_FALSE(amp::optimizer_state_dict(*adam)
                  .toGenericDict()
                  .at("param_groups")
                  .toList()
                  .get(0)
                  .toGenericDict()
                  .at("decoupled_weight_decay")
                  .toBool());
}

TEST_CASE(
    "A state of other groups, with a parameter listed twice or with a bad value is refused "
    "before any group loads",
    "[serialize][state_dict][optim][python]") {
  amp_test::TempDir dir("optimizer_state");
  const auto saved = python_adamw_file(dir);
  std::vector<at::Tensor> params = trainable_copies(saved.at("params"));
  const auto file = saved.at("optimizer").toGenericDict();
  // LibTorch's own load (under LibTorch's and amp's unfused AdamW) replaces a group before it
  // checks the next one; amp's fused optimizers check first. Every one must end unchanged.
  const std::string kind = GENERATE("adamw_libtorch", "adamw", "adamw_fused");
  CAPTURE(kind);
  auto optimizer = optimizer_for(kind, params);
  set_grads(params, {torch::ones_like(params[0]), torch::ones_like(params[1])});
  optimizer->step();  // a state of its own, other than the file's
  const auto before = optimizer_rows(params, *optimizer);
  // `file` with param group g's entry `key` set to `value`.
  const auto with_group = [&](std::size_t g, const std::string& key, const c10::IValue& value) {
    auto changed = file.copy();
    auto groups = changed.at("param_groups").toList().copy();
    auto group = groups.get(g).toGenericDict().copy();
    group.insert_or_assign(key, value);
    groups.set(g, group);
    changed.insert_or_assign("param_groups", groups);
    return changed;
  };
  const auto indices = [](std::vector<int64_t> values) {
    c10::impl::GenericList list(c10::IntType::get());
    for (int64_t v : values) list.push_back(v);
    return list;
  };
  // Group 0 matches, group 1 is empty: group 0 must not have been loaded.
  CHECK_THROWS_WITH(
      amp::load_optimizer_state_dict(*optimizer, with_group(1, "params", indices({}))),
      Contains("group 1 of the checkpoint has 0 parameters but this optimizer's "
               "group 1 has 1"));
  CHECK(optimizer_rows(params, *optimizer) == before);
  // Parameter 1 in both groups: Python would keep one of the two; LibTorch's load would leave the
  // other parameter without state, which the next save dereferences.
  CHECK_THROWS_WITH(
      amp::load_optimizer_state_dict(*optimizer, with_group(0, "params", indices({1}))),
      Contains("parameter index 1 is listed twice in \"param_groups\" (in group 0 "
               "and in group 1)"));
  CHECK(optimizer_rows(params, *optimizer) == before);
  CHECK_THROWS_WITH(amp::load_optimizer_state_dict(*optimizer, with_group(0, "maximize", 1)),
                    Contains("param group 0's \"maximize\" is a Int; Python writes True or False"));
  // A step that is no count.
  for (const double step : {std::nan(""), -1.0, 2.5, 1e300}) {
    CAPTURE(step);
    auto changed = file.copy();
    auto state = changed.at("state").toGenericDict().copy();
    auto entry = state.at(0).toGenericDict().copy();
    entry.insert_or_assign("step", at::scalar_tensor(step, at::kDouble));
    state.insert_or_assign(0, entry);
    changed.insert_or_assign("state", state);
    CHECK_THROWS_WITH(amp::load_optimizer_state_dict(*optimizer, changed),
                      Contains("the step of parameter 0 is") &&
                          Contains("a step count is a whole number from 0 to 2^53"));
  }
  CHECK(optimizer_rows(params, *optimizer) == before);
  // Still saves, and the file itself loads.
  amp::load_optimizer_state_dict(*optimizer, file);
  CHECK(optimizer_rows(params, *optimizer) != before);
}

TEST_CASE(
    "Python's int betas, an Adam group without weight decay and a zero-stride state load into "
    "AdamW",
    "[serialize][state_dict][optim][python]") {
  amp_test::TempDir dir("optimizer_state");
  const auto saved = python_adamw_file(dir);
  std::vector<at::Tensor> params = trainable_copies(saved.at("params"));
  auto changed = saved.at("optimizer").toGenericDict().copy();
  auto groups = changed.at("param_groups").toList().copy();
  // Group 1 has weight_decay 0: as Python's Adam it computes AdamW's update, and Python's AdamW
  // takes it. betas=(0, 0.999) holds an int, as Python keeps what the user wrote.
  auto group = groups.get(1).toGenericDict().copy();
  group.insert_or_assign("decoupled_weight_decay", false);
  group.insert_or_assign("betas", c10::ivalue::Tuple::create({int64_t{0}, 0.999}));
  groups.set(1, group);
  changed.insert_or_assign("param_groups", groups);
  // A state tensor laid out with a zero stride (as an edited file can give it), which in-place
  // updates refuse: loaded as its values, so the next step runs.
  auto state = changed.at("state").toGenericDict().copy();
  auto entry = state.at(1).toGenericDict().copy();
  const at::Tensor exp_avg = entry.at("exp_avg").toTensor();
  entry.insert_or_assign("exp_avg", exp_avg.flatten()[0].expand(exp_avg.sizes()));
  state.insert_or_assign(1, entry);
  changed.insert_or_assign("state", state);
  auto optimizer = optimizer_for("adamw", params);
  amp::load_optimizer_state_dict(*optimizer, changed);
  const auto& options =
      static_cast<const torch::optim::AdamWOptions&>(optimizer->param_groups()[1].options());
  CHECK(std::get<0>(options.betas()) == 0.0);
  CHECK(std::get<1>(options.betas()) == 0.999);
  set_grads(params, {torch::ones_like(params[0]), torch::ones_like(params[1])});
  CHECK_NOTHROW(optimizer->step());
  // With weight decay (group 0) the same flag is refused.
  auto decaying = changed.copy();
  auto groups0 = decaying.at("param_groups").toList().copy();
  auto group0 = groups0.get(0).toGenericDict().copy();
  group0.insert_or_assign("decoupled_weight_decay", false);
  groups0.set(0, group0);
  decaying.insert_or_assign("param_groups", groups0);
  CHECK_THROWS_WITH(amp::load_optimizer_state_dict(*optimizer, decaying),
                    Contains("param group 0 of the state has decoupled_weight_decay=False"));
}

TEST_CASE(
    "One training checkpoint (model, optimizer, scaler, step) moves from Python to C++ and "
    "back",
    "[serialize][state_dict][optim][python]") {
  amp_test::TempDir dir("checkpoint_dict");
  const auto from_python = dir.path() / "python.pt";
  const auto from_cpp = dir.path() / "cpp.pt";
  const auto expected = python("checkpoint-write " + quoted(from_python));
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(4, 8),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})),
                              torch::nn::Linear(8, 3));
  amp::optim::FusedAdamW optimizer(model->parameters(), amp::optim::FusedAdamWOptions(0.5));
  amp::GradScaler scaler(c10::DeviceType::CPU);

  const auto checkpoint = amp::load_pickled(from_python.string()).toGenericDict();
  amp::load_state_dict(*model, checkpoint.at("model"));
  amp::load_optimizer_state_dict(optimizer, checkpoint.at("optimizer"));
  scaler.load_state_dict(checkpoint.at("scaler").toGenericDict());
  CHECK(checkpoint.at("step").toInt() == 7);
  CHECK(scaler.get_scale() == 1024.0);  // two finite steps, growth every 3
  std::vector<std::vector<std::string>> model_rows;
  for (const auto& r : rows(*model)) {
    model_rows.push_back({"model." + r[0], r[1], r[2], r[3]});
  }
  CHECK(std::vector(expected.begin(), expected.begin() + model_rows.size()) == model_rows);

  c10::impl::GenericDict written(c10::StringType::get(), c10::AnyType::get());
  written.insert("model", amp::state_dict(*model));
  written.insert("optimizer", amp::optimizer_state_dict(optimizer));
  written.insert("scaler", scaler.state_dict());
  written.insert("step", int64_t{7});
  amp::save_pickled(written, from_cpp.string());
  // Python loads amp's file into its own model, AdamW and GradScaler: every entry as it wrote.
  CHECK(python("checkpoint-read " + quoted(from_cpp)) == expected);
}

TEST_CASE("Master weights and Kahan compensation go through Python's files and optimizers",
          "[serialize][state_dict][optim][python]") {
  const bool master = GENERATE(true, false);
  const std::string how = GENERATE("file", "optimizer", "optimizer-kept");
  CAPTURE(master, how);
  torch::manual_seed(31);
  std::vector<at::Tensor> params = {torch::randn({4, 3}).to(torch::kBFloat16).requires_grad_(true),
                                    torch::randn({5}).to(torch::kBFloat16).requires_grad_(true)};
  const auto options =
      amp::optim::FusedAdamWOptions(0.01).master_weights(master).kahan_summation(!master);
  amp::optim::FusedAdamW trained(params, options);
  for (int step = 0; step < 2; ++step) {
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes()).to(torch::kBFloat16);
    trained.step();
  }
  const std::string key = master ? "master_weight" : "kahan_comp";
  const auto state_rows = [&key](const torch::optim::Optimizer& opt) {
    std::vector<std::vector<std::string>> out;
    for (const auto& entry : opt.state()) {
      const auto& s = static_cast<const amp::optim::FusedAdamParamState&>(*entry.second);
      out.push_back(row(key, key == "master_weight" ? s.master_weight() : s.kahan_comp()));
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto before = state_rows(trained);
  REQUIRE(before.size() == 2);
  CHECK(before[0][1] == (master ? "float32" : "bfloat16"));

  amp_test::TempDir dir("optimizer_state");
  c10::impl::GenericList saved_params(c10::TensorType::get());
  for (const auto& p : params) saved_params.push_back(p.detach().clone());
  c10::impl::GenericDict file(c10::StringType::get(), c10::AnyType::get());
  file.insert("params", saved_params);
  file.insert("optimizer", amp::optimizer_state_dict(trained));
  amp::save_pickled(file, (dir.path() / "amp.pt").string());
  python("optimizer-roundtrip " + quoted(dir.path() / "amp.pt") + " " +
         quoted(dir.path() / "python.pt") + " " + how);
  const c10::IValue back = amp::load_pickled((dir.path() / "python.pt").string());

  amp::optim::FusedAdamW resumed(params, options);
  amp::load_optimizer_state_dict(resumed, back.toGenericDict().at("optimizer"));
  if (master && how == "optimizer") {
    // Python's load_state_dict casts every state tensor to its parameter's dtype: the float32
    // master copies come back rounded to bf16 (amp takes them as float32 again).
    std::vector<std::vector<std::string>> rounded;
    for (const auto& entry : trained.state()) {
      const auto& s = static_cast<const amp::optim::FusedAdamParamState&>(*entry.second);
      rounded.push_back(row(key, s.master_weight().to(torch::kBFloat16).to(torch::kFloat)));
    }
    std::sort(rounded.begin(), rounded.end());
    CHECK(rounded != before);
    CHECK(state_rows(resumed) == rounded);
  } else {
    // Kept exactly: through the file alone, Kahan compensation (bf16, the parameters' dtype) even
    // through Python's optimizer, and master copies when keep_amp_state's hooks restore them.
    CHECK(state_rows(resumed) == before);
  }
}

TEST_CASE("A value the pickle refers to many times is read once and shared, as in Python",
          "[serialize][state_dict][python]") {
  // 60 levels of [previous, previous]: 2^60 paths to one tensor, a few hundred pickle bytes.
  amp_test::TempDir dir("state_dict");
  const auto path = dir.path() / "shared.pt";
  python("shared " + quoted(path));
  c10::IValue value = amp::load_pickled(path.string());
  for (int level = 0; level < 60; ++level) {
    const auto list = value.toList();
    REQUIRE(list.size() == 2);
    CHECK(list.get(0).isSameIdentity(list.get(1)));
    value = list.get(0);
  }
  CHECK(torch::equal(value.toList().get(0).toTensor(), torch::ones({2})));
}
