// Files Python writes and loads that amp once crashed on or refused: values that hold themselves,
// BatchNorm files older than num_batches_tracked, nn.Parameters, optimizer states with a tensor
// option or of another optimizer type, and damaged records that reached LibTorch's own errors.
// What Python makes of each file comes from python_files_reference.py on this machine.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <amp/optim.h>
#include <amp/state_dict.h>

#include "serialize/pickle_values.h"
#include "serialize/reader_error.h"
#include "serialize/zip_edit.h"
#include "support/python_rows.h"
#include "support/temp_dir.h"
#include "support/warnings.h"

using Catch::Contains;

namespace {

using Rows = std::vector<std::vector<std::string>>;

// The reference's files, written once per process, and its rows.
struct PythonFiles {
  amp_test::TempDir dir{"python_files"};
  Rows rows;
  std::string path(const std::string& name) const { return (dir.path() / name).string(); }
  // Python's word on `name` for a kind of row ("load", "strict"): "ok" or "error", and its text.
  std::pair<std::string, std::string> said(const std::string& kind, const std::string& name) const {
    for (const auto& row : rows) {
      if (row.size() >= 3 && row[0] == kind && row[1] == name) {
        return {row[2], row.size() > 3 ? row[3] : ""};
      }
    }
    FAIL("the reference printed no " << kind << " row for " << name);
    return {};
  }
  // The model rows (key, dtype, shape, bytes) Python printed after its version-1 load.
  Rows model_rows() const {
    Rows out;
    for (const auto& row : rows) {
      if (row.size() == 4 && row[0] != "load" && row[0] != "strict") out.push_back(row);
    }
    return out;
  }
};

const PythonFiles& python_files() {
  static const std::unique_ptr<PythonFiles> files = [] {
    auto made = std::make_unique<PythonFiles>();
    made->rows = amp_test::python_rows(AMP_TEST_PYTHON,
                                       AMP_TEST_SOURCE_DIR "/serialize/python_files_reference.py",
                                       "write \"" + made->dir.path().string() + "\"");
    return made;
  }();
  return *files;
}

// The reference's Linear-BatchNorm1d model before a load: other weights, num_batches_tracked 5.
torch::nn::Sequential fresh_bn_model() {
  torch::nn::Sequential m(torch::nn::Linear(2, 3), torch::nn::BatchNorm1d(3));
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.uniform_(-3, 3);
  m[1]->named_buffers()["num_batches_tracked"].fill_(5);
  return m;
}

Rows rows_of(const torch::nn::Module& module) {
  Rows out;
  for (const auto& entry : amp::state_dict(module)) {
    out.push_back(amp_test::tensor_row(entry.key(), entry.value()));
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// An optimizer over one parameter of 4 elements that has taken a step, for the state files.
template <typename Optimizer, typename Options>
struct OneParameter {
  at::Tensor p = torch::randn({4}).requires_grad_(true);
  Optimizer optimizer;
  explicit OneParameter(Options options) : optimizer({p}, std::move(options)) {
    p.mutable_grad() = torch::randn({4});
    optimizer.step();
  }
};

}  // namespace

TEST_CASE("A torch.save file whose values hold themselves is refused with a sentence, not a crash",
          "[serialize][state_dict][python]") {
  const PythonFiles& files = python_files();
  // Python's weights_only load builds each of them (`loop[1] is loop`).
  for (const char* name : {"cycle_list.pt", "cycle_dict.pt", "cycle_tuple.pt"}) {
    CAPTURE(name);
    CHECK(files.said("load", name).first == "ok");
    CHECK_THROWS_WITH(amp::load_pickled(files.path(name)),
                      Contains("cannot read '" + files.path(name) + "'"));
  }
  // The tuple's loop is closed by an APPEND to a list already inside the tuple, which the
  // archive checker refuses first.
  CHECK_THROWS_WITH(amp::load_pickled(files.path("cycle_tuple.pt")),
                    Contains("APPEND) changes a list that is already inside another value"));
  // The kind named is the container that closes the loop.
  CHECK_THROWS_WITH(amp::load_pickled(files.path("cycle_list.pt")),
                    Contains("a list holds itself"));
  CHECK_THROWS_WITH(amp::load_pickled(files.path("cycle_dict.pt")),
                    Contains("a dict holds itself"));
}

TEST_CASE(
    "BatchNorm and InstanceNorm state dicts older than their buffers load as Python loads them",
    "[serialize][state_dict][python]") {
  const PythonFiles& files = python_files();
  SECTION(
      "without num_batches_tracked, a plain dict and a version-1 file load strictly, the "
      "module keeping its count") {
    for (const char* name : {"bn_plain.pt", "bn_v1.pt"}) {
      CAPTURE(name);
      REQUIRE(files.said("strict", name).first == "ok");
      auto model = fresh_bn_model();
      const amp::StateDictKeys keys = amp::load_state_dict(*model, files.path(name), true);
      CHECK(keys.missing_keys.empty());
      CHECK(keys.unexpected_keys.empty());
      CHECK(rows_of(*model) == files.model_rows());
    }
  }
  SECTION("a version-2 file without it is refused, naming the key, as Python refuses it") {
    CHECK(files.said("strict", "bn_v2.pt").first == "error");
    auto model = fresh_bn_model();
    const Rows before = rows_of(*model);
    CHECK_THROWS_WITH(amp::load_state_dict(*model, files.path("bn_v2.pt"), true),
                      Contains("Missing key(s): \"1.num_batches_tracked\""));
    CHECK(rows_of(*model) == before);
    // Not strict, the count is reported missing and kept.
    const amp::StateDictKeys keys = amp::load_state_dict(*model, files.path("bn_v2.pt"), false);
    CHECK(keys.missing_keys == std::vector<std::string>{"1.num_batches_tracked"});
    CHECK(model[1]->named_buffers()["num_batches_tracked"].item<int64_t>() == 5);
  }
  SECTION("an IValue has no _metadata: its modules are read as version-less, as a plain dict") {
    auto model = fresh_bn_model();
    const c10::IValue state = amp::load_pickled(files.path("bn_v2.pt"));
    CHECK(amp::load_state_dict(*model, state, true).missing_keys.empty());
    CHECK(rows_of(*model) == files.model_rows());
  }
  SECTION(
      "an InstanceNorm without running statistics refuses a version-less file that has "
      "them, in Python's words") {
    const auto [verdict, text] = files.said("strict", "in_plain.pt");
    REQUIRE(verdict == "error");
    torch::nn::Sequential model(torch::nn::Linear(2, 3), torch::nn::InstanceNorm1d(3));
    const Rows before = rows_of(*model);
    for (const bool strict : {true, false}) {
      CHECK_THROWS_WITH(amp::load_state_dict(*model, files.path("in_plain.pt"), strict),
                        Contains(text) && Contains("The module is unchanged."));
    }
    CHECK(rows_of(*model) == before);
  }
}

TEST_CASE("nn.Parameters in a torch.save file (state_dict(keep_vars=True)) read as their tensors",
          "[serialize][state_dict][python]") {
  const PythonFiles& files = python_files();
  REQUIRE(files.said("strict", "keep_vars.pt").first == "ok");
  auto model = fresh_bn_model();
  amp::load_state_dict(*model, files.path("keep_vars.pt"), true);
  const Rows loaded = rows_of(*model);
  Rows expected = files.model_rows();
  expected.back() = amp_test::tensor_row("1.num_batches_tracked", torch::tensor(int64_t{7}));
  CHECK(loaded == expected);
  // Loaded whole, a Parameter requires grad as Python's does; a plain tensor does not.
  CHECK(files.said("load", "parameter.pt").first == "ok");
  const c10::IValue value = amp::load_pickled(files.path("parameter.pt"));
  const at::Tensor p = amp::dict_entry(value, "p").toTensor();
  CHECK(p.requires_grad());
  CHECK(p.is_leaf());
  CHECK(torch::equal(p.detach(), torch::arange(3.0)));
  CHECK_FALSE(amp::dict_entry(value, "t").toTensor().requires_grad());
}

TEST_CASE(
    "An optimizer state with a tensor option loads with its value, and one of another type is "
    "refused naming both types",
    "[serialize][state_dict][optimizer][python]") {
  const PythonFiles& files = python_files();
  for (const char* name : {"adamw_lr_tensor.pt", "adamw_fused.pt", "sgd.pt"}) {
    CHECK(files.said("load", name).first == "ok");
  }
  SECTION("lr=torch.tensor(0.01) is read as Python's _to_scalar reads it") {
    OneParameter<amp::optim::AdamW, torch::optim::AdamWOptions> adamw(
        torch::optim::AdamWOptions(0.5));
    amp::load_optimizer_state_dict(adamw.optimizer, files.path("adamw_lr_tensor.pt"));
    const auto& options =
        static_cast<const torch::optim::AdamWOptions&>(adamw.optimizer.param_groups()[0].options());
    CHECK(options.lr() == static_cast<double>(0.01f));  // the float32 tensor's value
    const at::Tensor before = adamw.p.detach().clone();
    adamw.p.mutable_grad() = torch::ones({4});
    adamw.optimizer.step();
    CHECK_FALSE(torch::equal(before, adamw.p.detach()));
  }
  SECTION("a tensor option of more than one element is refused, the optimizer unchanged") {
    OneParameter<amp::optim::AdamW, torch::optim::AdamWOptions> adamw(
        torch::optim::AdamWOptions(0.5));
    c10::IValue state = amp::load_pickled(files.path("adamw_lr_tensor.pt"));
    amp::dict_entry(state, "param_groups")
        .toList()
        .get(0)
        .toGenericDict()
        .insert_or_assign("lr", torch::full({2}, 0.01));
    CHECK_THROWS_WITH(
        amp::load_optimizer_state_dict(adamw.optimizer, state),
        Contains("param group 0's \"lr\" is a tensor of 2 elements; an option is a number or a "
                 "tensor of one real element") &&
            Contains("The optimizer is unchanged."));
    CHECK(
        static_cast<const torch::optim::AdamWOptions&>(adamw.optimizer.param_groups()[0].options())
            .lr() == 0.5);
  }
  SECTION("Python's fused AdamW state into LibTorch's SGD, and its SGD state into FusedAdamW") {
    OneParameter<torch::optim::SGD, torch::optim::SGDOptions> sgd(
        torch::optim::SGDOptions(0.1).momentum(0.5));
    const c10::IValue sgd_before = amp::optimizer_state_dict(sgd.optimizer);
    CHECK_THROWS_WITH(
        amp::load_optimizer_state_dict(sgd.optimizer, files.path("adamw_fused.pt")),
        Contains("param group 0 of the state is of an Adam optimizer (it has \"betas\" and "
                 "\"eps\") but torch::optim::SGD is an SGD optimizer (its groups have "
                 "\"momentum\" and \"dampening\")") &&
            Contains("The optimizer is unchanged."));
    const auto buffer = [](const c10::IValue& state) {
      return amp::dict_entry(state, "state")
          .toGenericDict()
          .at(0)
          .toGenericDict()
          .at("momentum_buffer")
          .toTensor();
    };
    CHECK(torch::equal(buffer(amp::optimizer_state_dict(sgd.optimizer)), buffer(sgd_before)));
    OneParameter<amp::optim::FusedAdamW, amp::optim::FusedAdamWOptions> fused(
        amp::optim::FusedAdamWOptions(0.01));
    CHECK_THROWS_WITH(
        amp::load_optimizer_state_dict(fused.optimizer, files.path("sgd.pt")),
        Contains("param group 0 of the state is of an SGD optimizer (it has \"momentum\" and "
                 "\"dampening\") but amp::optim::FusedAdamW is an Adam optimizer") &&
            !Contains("torch::save(optimizer, path)"));
  }
  SECTION("a fused=True file loaded into the unfused AdamW says that the arithmetic changes") {
    OneParameter<amp::optim::AdamW, torch::optim::AdamWOptions> adamw(
        torch::optim::AdamWOptions(0.01));
    amp_test::WarningCollector collector;
    c10::WarningUtils::WarningHandlerGuard guard(&collector);
    amp::load_optimizer_state_dict(adamw.optimizer, files.path("adamw_fused.pt"));
    REQUIRE(collector.messages.size() == 1);
    CHECK_THAT(collector.messages[0],
               Contains("was saved by Python's fused=True optimizer but amp::optim::AdamW "
                        "continues it with single-tensor arithmetic") &&
                   Contains("FusedAdamW"));
    // The fused optimizer takes the same file without a word.
    OneParameter<amp::optim::FusedAdamW, amp::optim::FusedAdamWOptions> fused(
        amp::optim::FusedAdamWOptions(0.01));
    amp::load_optimizer_state_dict(fused.optimizer, files.path("adamw_fused.pt"));
    CHECK(collector.messages.size() == 1);
  }
}

TEST_CASE(
    "A storage key read again with more elements than its first record is refused naming "
    "the file",
    "[serialize][state_dict][python]") {
  const PythonFiles& files = python_files();
  amp_test::TempDir dir("storage_twice");
  const std::string path = (dir.path() / "two.pt").string();
  // The first record now says 2 elements, viewed as 2; the second names the first's storage
  // with its own 4, which the checker bounds by the entry's 16 bytes.
  std::string bytes = read_file(files.path("two_storages.pt"));
  bytes = amp_test::edit_entry(bytes, "/data.pkl", "K\x04t", "K\x02t");
  bytes = amp_test::edit_entry(bytes, "/data.pkl", "K\x04\x85", "K\x02\x85");
  bytes = amp_test::edit_entry(bytes, "/data.pkl",
                               std::string("X\x01\x00\x00\x00"
                                           "1",
                                           6),
                               std::string("X\x01\x00\x00\x00"
                                           "0",
                                           6));
  write_file(path, bytes);
  CHECK_THROWS_WITH(amp::load_pickled(path),
                    Contains("cannot read '" + path + "'") &&
                        Contains("the storage 0 is given 2 and then 4 elements"));
}

TEST_CASE("A dict freed while the pickle is read leaves no keys behind for a later dict",
          "[serialize][pickle]") {
  // {"x": OrderedDict() with attributes {"a": 1} (BUILD), "y": {"a": 1}}: the attributes' dict
  // is no longer on the stack when "y"'s is made, and may be given its address.
  const char kPickle[] =
      "\x80\x02}X\x01\x00\x00\x00"
      "xccollections\nOrderedDict\n)R}X\x01\x00\x00\x00"
      "aK\x01sbsX\x01\x00\x00\x00"
      "y}X\x01\x00\x00\x00"
      "aK\x01ss.";
  const std::string pickle(kPickle, sizeof kPickle - 1);
  const amp::detail::PickledValue root = amp::detail::evaluate_torch_pickle(pickle, "data.pkl");
  REQUIRE(root.kind == amp::detail::PickledValue::Kind::kDict);
  REQUIRE(root.items->size() == 4);
  const amp::detail::PickledValue& x = (*root.items)[1];
  CHECK(x.ordered_dict);
  REQUIRE(x.attributes);
  CHECK(x.attributes->kind == amp::detail::PickledValue::Kind::kDict);
  CHECK((*root.items)[3].items->size() == 2);
}

TEST_CASE("make_dict and dict_entry build and read the AMP recipe's one-file checkpoint",
          "[serialize][state_dict]") {
  amp_test::TempDir dir("make_dict");
  const std::string path = (dir.path() / "checkpoint.pt").string();
  torch::nn::Linear model(2, 3);
  OneParameter<amp::optim::FusedAdamW, amp::optim::FusedAdamWOptions> adamw(
      amp::optim::FusedAdamWOptions(0.01));
  amp::save_pickled(amp::make_dict({{"model", amp::state_dict(*model)},
                                    {"optimizer", amp::optimizer_state_dict(adamw.optimizer)},
                                    {"step", int64_t{12}}}),
                    path);
  const c10::IValue checkpoint = amp::load_pickled(path);
  CHECK(amp::dict_entry(checkpoint, "step").toInt() == 12);
  torch::nn::Linear other(2, 3);
  amp::load_state_dict(*other, amp::dict_entry(checkpoint, "model"));
  CHECK(torch::equal(other->weight, model->weight));
  amp::load_optimizer_state_dict(adamw.optimizer, amp::dict_entry(checkpoint, "optimizer"));
  CHECK_THROWS_WITH(amp::dict_entry(checkpoint, "scaler"),
                    Contains("amp::dict_entry: the dict has no entry \"scaler\"; it has \"model\", "
                             "\"optimizer\", \"step\"."));
  CHECK_THROWS_WITH(amp::make_dict({{"step", 1}, {"step", 2}}),
                    Contains("amp::make_dict: the key \"step\" is given twice"));
  CHECK_THROWS_WITH(amp::dict_entry(c10::IValue(3), "model"),
                    Contains("amp::dict_entry: the value is a Int, not a dict"));
}
