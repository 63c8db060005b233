// GradScaler's state: state_dict keys and types, all-or-nothing loading, files, archives, Python.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>

#include <amp/grad_scaler.h>

#include "support/scaler_helpers.h"
#include "support/warnings.h"

using amp_test::make_state_dict;

namespace {

// A scaler that has run a few iterations: scale 256 (from 1024: inf, inf, clean), tracker 1.
GradScaler trained_scaler(GradScalerOptions options = GradScalerOptions().init_scale(1024.0)) {
  auto scaler = cpu_scaler(std::move(options));
  auto param = make_param(1);
  torch::optim::SGD optimizer({param}, 0.0);
  scaler.scale(torch::ones({}));
  for (float grad : {INFINITY, NAN, 1.0f}) {
    set_grad(param, torch::full({1}, grad));
    scaler.step(optimizer);
    scaler.update();
  }
  return scaler;
}

c10::Dict<std::string, c10::IValue> python_style_dict() {
  auto dict = make_state_dict();
  dict.insert("scale", 128.0);
  dict.insert("growth_factor", 3.0);
  dict.insert("backoff_factor", 0.25);
  dict.insert("growth_interval", int64_t{5});
  dict.insert("_growth_tracker", int64_t{4});
  return dict;
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("amp_scaler_" + std::to_string(::getpid()) + "_" + name);
}

int run_python(const std::string& args) {
  const std::string command = std::string("\"") + AMP_TEST_PYTHON + "\" \"" + AMP_TEST_SOURCE_DIR +
                              "/parity/scaler_interop.py\" " + args;
  return std::system(command.c_str());
}

}  // namespace

std::set<std::string> keys_of(const c10::Dict<std::string, c10::IValue>& dict) {
  std::set<std::string> keys;
  for (const auto& entry : dict) keys.insert(entry.key());
  return keys;
}

TEST_CASE("A default scaler's state_dict has exactly Python's five keys and value types",
          "[scaler][state]") {
  const auto scaler = trained_scaler();
  const auto dict = scaler.state_dict();
  // torch.amp.GradScaler.state_dict() of torch 2.14 (the key set is also compared with Python's
  // own in the file tests below).
  CHECK(keys_of(dict) == std::set<std::string>{"scale", "growth_factor", "backoff_factor",
                                               "growth_interval", "_growth_tracker"});
  CHECK(dict.at("scale").isDouble());
  CHECK(dict.at("scale").toDouble() == 256.0);
  CHECK(dict.at("growth_factor").isDouble());
  CHECK(dict.at("growth_factor").toDouble() == 2.0);
  CHECK(dict.at("backoff_factor").isDouble());
  CHECK(dict.at("backoff_factor").toDouble() == 0.5);
  CHECK(dict.at("growth_interval").isInt());
  CHECK(dict.at("growth_interval").toInt() == 2000);
  CHECK(dict.at("_growth_tracker").isInt());
  CHECK(dict.at("_growth_tracker").toInt() == 1);
}

TEST_CASE("A scaler using an extension adds the _amp_ keys to Python's five", "[scaler][state]") {
  const auto with = [](GradScalerOptions options) {
    return keys_of(trained_scaler(options.init_scale(1024.0)).state_dict());
  };
  const std::set<std::string> extended = {"scale",
                                          "growth_factor",
                                          "backoff_factor",
                                          "growth_interval",
                                          "_growth_tracker",
                                          "_amp_format_version",
                                          "_amp_hysteresis",
                                          "_amp_consecutive_hysteresis",
                                          "_amp_hysteresis_remaining",
                                          "_amp_min_scale",
                                          "_amp_max_scale"};
  CHECK(with(GradScalerOptions().hysteresis(2)) == extended);
  CHECK(with(GradScalerOptions().min_scale(1.0)) == extended);
  CHECK(with(GradScalerOptions().max_scale(1e6)) == extended);
  CHECK(with(GradScalerOptions().consecutive_hysteresis(true)) == extended);
  auto counted = extended;
  counted.insert({"_amp_steps_taken", "_amp_steps_skipped", "_amp_consecutive_skips"});
  CHECK(with(GradScalerOptions().track_counters(true)) == counted);
  // The options that only change what step() does on the host keep Python's five keys.
  CHECK(with(GradScalerOptions().at_min_scale(amp::MinScalePolicy::kThrow)).size() == 5);
}

TEST_CASE("options() holds the values in use after setters and loads", "[scaler][state]") {
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(8.0).hysteresis(2));
  scaler.set_growth_factor(3.0);
  scaler.set_backoff_factor(0.25);
  scaler.set_growth_interval(7);
  CHECK(scaler.options().growth_factor() == 3.0);
  CHECK(scaler.options().backoff_factor() == 0.25);
  CHECK(scaler.options().growth_interval() == 7);
  CHECK(scaler.options().init_scale() == 8.0);

  // Python's load_state_dict makes the loaded scale the lazy-init scale (_init_scale).
  scaler.load_state_dict(python_style_dict());
  CHECK(scaler.options().init_scale() == 128.0);
  CHECK(scaler.options().growth_factor() == 3.0);
  CHECK(scaler.options().backoff_factor() == 0.25);
  CHECK(scaler.options().growth_interval() == 5);
  // A dict without _amp_ keys keeps this scaler's extensions.
  CHECK(scaler.options().hysteresis() == 2);
  CHECK(scaler.hysteresis_remaining() == 2);

  auto dict = python_style_dict();
  dict.insert("_amp_hysteresis", int64_t{4});
  dict.insert("_amp_hysteresis_remaining", int64_t{3});
  dict.insert("_amp_min_scale", 2.0);
  scaler.load_state_dict(dict);
  CHECK(scaler.options().hysteresis() == 4);
  CHECK(scaler.hysteresis_remaining() == 3);
  CHECK(scaler.options().min_scale() == 2.0);
}

TEST_CASE("A state dict round-trips into a fresh scaler, before and after lazy init",
          "[scaler][state]") {
  const auto source = trained_scaler();
  auto before_init = cpu_scaler();
  before_init.load_state_dict(source.state_dict());
  CHECK(before_init.get_scale() == 256.0);
  CHECK(before_init.get_growth_tracker() == 1);
  before_init.scale(torch::ones({}));  // lazy init takes the loaded values
  CHECK(before_init.scale_tensor().item<float>() == 256.0f);
  CHECK(before_init.growth_tracker_tensor().item<int>() == 1);

  auto after_init = cpu_scaler();
  after_init.scale(torch::ones({}));
  after_init.load_state_dict(python_style_dict());
  CHECK(after_init.get_scale() == 128.0);
  CHECK(after_init.get_growth_tracker() == 4);
  CHECK(after_init.get_growth_factor() == 3.0);
  CHECK(after_init.get_backoff_factor() == 0.25);
  CHECK(after_init.get_growth_interval() == 5);
}

TEST_CASE("An empty state dict is refused with Python's message", "[scaler][state]") {
  auto scaler = cpu_scaler();
  CHECK_THROWS_WITH(scaler.load_state_dict(make_state_dict()),
                    Contains("The source state dict is empty, possibly because it was saved from "
                             "a disabled instance of GradScaler."));
  // What a disabled scaler saves is what an enabled one refuses.
  const auto disabled = cpu_scaler(GradScalerOptions().enabled(false));
  CHECK_THROWS_WITH(scaler.load_state_dict(disabled.state_dict()),
                    Contains("The source state dict is empty"));
}

// Everything a load may write, as it reads back: the state dict (every key and value) and the
// options in use.
std::string observable_state(const GradScaler& scaler) {
  std::ostringstream out;
  out.precision(17);
  for (const auto& entry : scaler.state_dict()) out << entry.key() << '=' << entry.value() << ';';
  const auto& o = scaler.options();
  out << "init_scale=" << o.init_scale() << ";growth_factor=" << o.growth_factor()
      << ";backoff_factor=" << o.backoff_factor() << ";growth_interval=" << o.growth_interval()
      << ";hysteresis=" << o.hysteresis() << ";consecutive=" << o.consecutive_hysteresis()
      << ";min_scale=" << o.min_scale() << ";max_scale=" << o.max_scale()
      << ";remaining=" << scaler.hysteresis_remaining();
  return out.str();
}

TEST_CASE("A bad state dict throws and leaves the scaler exactly as it was", "[scaler][state]") {
  // With extensions and counters, so that their state is in the comparison; once before lazy
  // init (state held on the host) and once after (state in tensors).
  const auto options = GradScalerOptions().init_scale(1024.0).hysteresis(2).track_counters(true);
  auto trained = trained_scaler(options);
  auto fresh = cpu_scaler(options);
  auto dict = python_style_dict();
  std::string expected;
  SECTION("missing key") {
    REQUIRE(dict.erase("_growth_tracker") == 1);
    expected = "the state dict has no key '_growth_tracker'";
  }
  // Each: entries that replace or join the dict's, and the message the load must throw.
  struct BadEntries {
    std::string what;
    std::vector<std::pair<std::string, c10::IValue>> entries;
    std::string expected;
  };
  const std::vector<BadEntries> cases = {
      {"wrong type",
       {{"growth_interval", 2.5}},
       "'growth_interval' must be an int, got a value of type Double"},
      {"string scale",
       {{"scale", std::string("big")}},
       "'scale' must be a float, got a value of type String"},
      {"non-finite scale",
       {{"scale", std::numeric_limits<double>::infinity()}},
       "'scale' must be finite and > 0, within float32's normal range"},
      {"non-positive scale",
       {{"scale", 0.0}},
       "'scale' must be finite and > 0, within float32's normal range [1.17549e-38, 3.40282e+38] "
       "since the scale is kept in a float32 tensor. Got scale=0"},
      {"a scale that overflows float32 (one flipped exponent bit of 65536)",
       {{"scale", 1e39}},
       "Got scale=1e+39; the checkpoint is damaged"},
      {"a scale that flushes to zero in float32",
       {{"scale", 1e-50}},
       "Got scale=1e-50; the checkpoint is damaged"},
      {"a subnormal float32 scale, whose reciprocal overflows",
       {{"scale", 1e-40}},
       "Got scale=1e-40; the checkpoint is damaged"},
      {"growth_interval below 1",
       {{"growth_interval", int64_t{0}}},
       "The growth interval must be >= 1. Got growth_interval=0"},
      {"bad growth factor",
       {{"growth_factor", 0.5}},
       "The growth factor must be > 1.0. Got growth_factor=0.5"},
      {"negative growth tracker",
       {{"_growth_tracker", int64_t{-1}}},
       "'_growth_tracker' must be in [0, 2^31-1] (it is kept in an int32 tensor), got -1"},
      {"growth tracker beyond int32",
       {{"_growth_tracker", int64_t{1} << 62}},
       "'_growth_tracker' must be in [0, 2^31-1]"},
      {"newer format version",
       {{"_amp_format_version", int64_t{99}}},
       "the state dict has format version 99 but this amp reads versions up to 1"},
      {"bad extension value",
       {{"_amp_hysteresis", int64_t{0}}},
       "The hysteresis must be >= 1 and <= 2^31-1. Got hysteresis=0"},
      {"hysteresis beyond int32",
       {{"_amp_hysteresis", int64_t{1} << 31}},
       "Got hysteresis=2147483648"},
      {"hysteresis_remaining above the hysteresis",
       {{"_amp_hysteresis", int64_t{3}}, {"_amp_hysteresis_remaining", int64_t{4}}},
       "'_amp_hysteresis_remaining' must be in [0, 3], got 4"},
      {"negative hysteresis_remaining",
       {{"_amp_hysteresis_remaining", int64_t{-2}}},
       "'_amp_hysteresis_remaining' must be in [0, 2], got -2"},
      {"a scale outside the loaded bounds",
       {{"_amp_min_scale", 1.0}, {"_amp_max_scale", 64.0}},
       "'scale' must lie in [min_scale, max_scale]. Got scale=128 with min_scale=1 and "
       "max_scale=64; the checkpoint was saved with other bounds or is damaged."},
      {"negative counters",
       {{"_amp_steps_taken", int64_t{-5}},
        {"_amp_steps_skipped", int64_t{0}},
        {"_amp_consecutive_skips", int64_t{0}}},
       "the counters must be >= 0 with consecutive skips <= skipped steps, got steps_taken=-5"},
      {"more consecutive skips than skipped steps",
       {{"_amp_steps_taken", int64_t{5}},
        {"_amp_steps_skipped", int64_t{2}},
        {"_amp_consecutive_skips", int64_t{3}}},
       "steps_skipped=2, consecutive_skips=3"},
  };
  for (const BadEntries& bad : cases) {
    DYNAMIC_SECTION(bad.what) {
      for (const auto& [key, value] : bad.entries) dict.insert_or_assign(key, value);
      expected = bad.expected;
    }
  }
  for (GradScaler* scaler : {&trained, &fresh}) {
    const std::string before = observable_state(*scaler);
    CHECK_THROWS_WITH(scaler->load_state_dict(dict), Contains(expected));
    CHECK(observable_state(*scaler) == before);
  }
}

TEST_CASE("A loaded state at the edges of its ranges is accepted and reads back",
          "[scaler][state]") {
  auto scaler = trained_scaler(GradScalerOptions().init_scale(1024.0).hysteresis(3));
  auto dict = python_style_dict();
  // float32's largest value and its smallest normal one survive the float32 scale tensor.
  for (double scale : {static_cast<double>(std::numeric_limits<float>::max()),
                       static_cast<double>(std::numeric_limits<float>::min())}) {
    dict.insert_or_assign("scale", scale);
    REQUIRE_NOTHROW(scaler.load_state_dict(dict));
    CHECK(scaler.get_scale() == scale);
  }
  // A tracker at or above growth_interval is a state Python and amp reach after
  // set_growth_interval lowers the interval, and save: it loads.
  dict.insert_or_assign("_growth_tracker", int64_t{7});
  dict.insert_or_assign("_amp_hysteresis_remaining", int64_t{0});
  REQUIRE_NOTHROW(scaler.load_state_dict(dict));
  CHECK(scaler.get_growth_tracker() == 7);
  CHECK(scaler.hysteresis_remaining() == 0);
  CHECK(scaler.options().hysteresis() == 3);
}

TEST_CASE("Scales that float32 cannot hold are refused by the constructor and update",
          "[scaler][state]") {
  for (double bad : {1e39, 1e-50, 1e-320, 1e-40}) {
    CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions().init_scale(bad)),
                      Contains("The initial scale must be finite and > 0, within float32's "
                               "normal range"));
  }
  auto scaler = trained_scaler();
  const double before = scaler.get_scale();
  CHECK_THROWS_WITH(scaler.update(1e-320), Contains("new_scale must be finite and > 0, within "
                                                    "float32's normal range"));
  CHECK_THROWS_WITH(scaler.update(1e39), Contains("Got new_scale=1e+39; pass a positive scale"));
  CHECK(scaler.get_scale() == before);
}

TEST_CASE("update(tensor) refuses what update(double) refuses, and other dtypes",
          "[scaler][state]") {
  auto scaler = trained_scaler();
  const double before = scaler.get_scale();
  for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity(), 0.0, -4.0, 1e-320}) {
    CHECK_THROWS_WITH(scaler.update(torch::full({}, bad, torch::kDouble)),
                      Contains("new_scale must be finite and > 0"));
  }
  CHECK_THROWS_WITH(scaler.update(torch::full({1}, 1e39, torch::kDouble)),
                    Contains("Got new_scale=1e+39; pass a positive scale"));
  CHECK_THROWS_WITH(scaler.update(torch::full({1}, 8, torch::kInt)),
                    Contains("Got a tensor of dtype Int; pass a floating-point tensor."));
  CHECK(scaler.get_scale() == before);
  // A valid scale in float64 or bf16 is stored as float32, as Python's copy_ does.
  scaler.update(torch::full({1}, 512.0, torch::kDouble));
  CHECK(scaler.get_scale() == 512.0);
  scaler.update(torch::full({}, 4.0, torch::kBFloat16));
  CHECK(scaler.get_scale() == 4.0);
}

TEST_CASE("A disabled scaler ignores load_state_dict, as in Python", "[scaler][state]") {
  auto scaler = cpu_scaler(GradScalerOptions().enabled(false));
  CHECK_NOTHROW(scaler.load_state_dict(python_style_dict()));
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("save_state_dict and load_state_dict(path) round-trip, and bad files are refused",
          "[scaler][state]") {
  const auto path = temp_path("roundtrip.pt");
  trained_scaler().save_state_dict(path.string());
  auto loaded = cpu_scaler();
  loaded.load_state_dict(path.string());
  CHECK(loaded.get_scale() == 256.0);
  CHECK(loaded.get_growth_tracker() == 1);

  auto untouched = trained_scaler(GradScalerOptions().init_scale(64.0));
  const double scale_before = untouched.get_scale();
  CHECK_THROWS_WITH(untouched.load_state_dict(temp_path("missing.pt").string()),
                    Contains("cannot open"));

  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto truncated = temp_path("truncated.pt");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  CHECK_THROWS_WITH(untouched.load_state_dict(truncated.string()),
                    Contains("is not a readable state dict file"));
  const auto garbage = temp_path("garbage.pt");
  std::ofstream(garbage, std::ios::binary) << "this is not a checkpoint";
  CHECK_THROWS_WITH(untouched.load_state_dict(garbage.string()),
                    Contains("is not a readable state dict file"));
  const auto tensor_file = temp_path("tensor.pt");
  {
    const auto data = torch::pickle_save(torch::ones({2}));
    std::ofstream(tensor_file, std::ios::binary).write(data.data(), data.size());
  }
  // A pickled tensor is refused at its first opcode a state dict of numbers cannot hold.
  CHECK_THROWS_WITH(untouched.load_state_dict(tensor_file.string()),
                    Contains("is not a readable state dict file") && Contains("is not allowed"));
  // A folder, and a file far larger than any state file, are refused before reading.
  CHECK_THROWS_WITH(untouched.load_state_dict(std::filesystem::temp_directory_path().string()),
                    Contains("is not a regular file (a folder, FIFO or device)"));
  const auto huge = temp_path("huge.pt");
  std::ofstream(huge, std::ios::binary) << std::string(3 << 20, 'x');
  CHECK_THROWS_WITH(untouched.load_state_dict(huge.string()),
                    Contains("has 3145728 bytes, more than the 1048576 a state file may have"));
  CHECK(untouched.get_scale() == scale_before);
  for (const auto& p : {path, truncated, garbage, tensor_file, huge}) std::filesystem::remove(p);
}

TEST_CASE("torch::save / torch::load and archives carry the scaler next to a model",
          "[scaler][state]") {
  const auto path = temp_path("archive.pt");
  const auto source = trained_scaler(
      GradScalerOptions().init_scale(1024.0).hysteresis(3).min_scale(1.0).track_counters(true));
  torch::save(source, path.string());
  auto target = cpu_scaler(GradScalerOptions().track_counters(true));
  torch::load(target, path.string());
  CHECK(target.get_scale() == source.get_scale());
  CHECK(target.get_growth_tracker() == source.get_growth_tracker());
  CHECK(target.options().hysteresis() == 3);
  CHECK(target.hysteresis_remaining() == source.hysteresis_remaining());
  CHECK(target.options().min_scale() == 1.0);
  CHECK(target.counters().steps_skipped == 2);
  CHECK(target.counters().steps_taken == 1);

  // One checkpoint with a model, an optimizer and the scaler.
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  torch::serialize::OutputArchive checkpoint;
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  model->save(model_archive);
  optimizer.save(optimizer_archive);
  checkpoint.write("model", model_archive);
  checkpoint.write("optimizer", optimizer_archive);
  checkpoint << source;
  checkpoint.save_to(path.string());

  torch::serialize::InputArchive restored;
  restored.load_from(path.string());
  auto resumed = cpu_scaler();
  restored >> resumed;
  CHECK(resumed.get_scale() == source.get_scale());
  torch::serialize::InputArchive model_in;
  restored.read("model", model_in);
  torch::nn::Linear model_copy(2, 1);
  model_copy->load(model_in);
  CHECK(torch::equal(model_copy->weight, model->weight));

  // Mid-iteration (after step, before update) the scaler refuses to be saved, as Python's pickle.
  {
    auto busy = cpu_scaler();
    auto param = make_param(1);
    torch::optim::SGD optimizer({param}, 0.0);
    busy.scale(torch::ones({}));
    set_grad(param, torch::ones({1}));
    busy.step(optimizer);
    CHECK_THROWS_WITH(torch::save(busy, path.string()),
                      Contains("A GradScaler instance may only be pickled at the beginning of an "
                               "iteration, or at the end after scaler.update()."));
    busy.update();
    CHECK_NOTHROW(torch::save(busy, path.string()));
  }

  // A disabled scaler writes nothing; loading that into an enabled one says so as Python does.
  torch::save(cpu_scaler(GradScalerOptions().enabled(false)), path.string());
  auto enabled = cpu_scaler();
  CHECK_THROWS_WITH(torch::load(enabled, path.string()),
                    Contains("The source state dict is empty"));
  std::filesystem::remove(path);
}

TEST_CASE("A state dict file from C++ loads in Python's torch.amp.GradScaler",
          "[scaler][state][python]") {
  const auto path = temp_path("to_python.pt");
  auto scaler = trained_scaler(GradScalerOptions().init_scale(1024.0).growth_interval(7));
  scaler.set_growth_factor(3.0);
  scaler.save_state_dict(path.string());
  // "exact": the file's keys must be the very keys Python's own state_dict() has.
  CHECK(run_python("check " + path.string() + " 256.0 1 3.0 0.5 7 exact") == 0);
  std::filesystem::remove(path);
}

TEST_CASE("An extended scaler's file loads in Python, which ignores the _amp_ keys",
          "[scaler][state][python]") {
  const auto path = temp_path("extended_to_python.pt");
  auto scaler = trained_scaler(GradScalerOptions().init_scale(1024.0).hysteresis(3));
  scaler.save_state_dict(path.string());
  CHECK(run_python("check " + path.string() + " 1024.0 1 2.0 0.5 2000 extended") == 0);
  std::filesystem::remove(path);
}

TEST_CASE("Python files with an int scale and int factors load in C++", "[scaler][state][python]") {
  // Python's GradScaler(init_scale=1024, growth_factor=3) writes the ints it was given until
  // its first scale() replaces the scale by a tensor's float.
  const auto path = temp_path("ints_from_python.pt");
  REQUIRE(run_python("write-ints " + path.string()) == 0);
  auto scaler = cpu_scaler();
  scaler.load_state_dict(path.string());
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.options().init_scale() == 1024.0);
  CHECK(scaler.get_growth_factor() == 3.0);
  CHECK(scaler.get_backoff_factor() == 0.5);
  CHECK(scaler.get_growth_interval() == 2000);
  CHECK(scaler.get_growth_tracker() == 0);
  // And the scale created by the next scale() is that int, as a float32 tensor.
  const auto scaled = scaler.scale(torch::ones({}));
  CHECK(scaled.item<float>() == 1024.0f);
  std::filesystem::remove(path);
}

TEST_CASE("A state dict file saved by Python's torch.save loads in C++",
          "[scaler][state][python]") {
  const auto path = temp_path("from_python.pt");
  REQUIRE(run_python("write " + path.string()) == 0);
  auto scaler = cpu_scaler();
  scaler.load_state_dict(path.string());
  CHECK(scaler.get_scale() == 64.0);
  CHECK(scaler.get_growth_tracker() == 2);
  CHECK(scaler.get_growth_factor() == 4.0);
  CHECK(scaler.get_backoff_factor() == 0.125);
  CHECK(scaler.get_growth_interval() == 3);
  // The next clean step completes the interval: 64 * 4.
  amp_test::clean_iteration(scaler);
  CHECK(scaler.get_scale() == 256.0);
  std::filesystem::remove(path);
}

TEST_CASE("After loading any valid state, a scaler saves a state it loads again",
          "[scaler][state]") {
  // Scalers with and without hysteresis, before and after lazy init, each loading states saved
  // by scalers with other extensions (and Python's five keys alone): what they then save must
  // be a state they accept, with the hysteresis allowance within the hysteresis in use.
  const std::vector<GradScalerOptions> kinds = {
      GradScalerOptions().init_scale(64.0), GradScalerOptions().init_scale(64.0).hysteresis(3),
      GradScalerOptions().init_scale(64.0).min_scale(1.0),
      GradScalerOptions().init_scale(64.0).hysteresis(2).track_counters(true)};
  std::vector<c10::Dict<std::string, c10::IValue>> sources = {python_style_dict()};
  for (const auto& kind : kinds) sources.push_back(trained_scaler(kind).state_dict());
  for (size_t k = 0; k < kinds.size(); ++k) {
    for (size_t s = 0; s < sources.size(); ++s) {
      for (bool initialized : {false, true}) {
        auto scaler = initialized ? trained_scaler(kinds[k]) : cpu_scaler(kinds[k]);
        INFO("scaler kind " << k << ", source " << s << ", initialized " << initialized);
        REQUIRE_NOTHROW(scaler.load_state_dict(sources[s]));
        CHECK(scaler.hysteresis_remaining() >= 0);
        CHECK(scaler.hysteresis_remaining() <= scaler.options().hysteresis());
        const auto saved = scaler.state_dict();
        CHECK_NOTHROW(scaler.load_state_dict(saved));
        auto twin = cpu_scaler(kinds[k]);
        CHECK_NOTHROW(twin.load_state_dict(saved));
        CHECK(observable_state(twin) == observable_state(scaler));
      }
    }
  }
}

TEST_CASE("A tracker at 2^31-1 stays there on a clean step, and the state saved then reloads",
          "[scaler][state]") {
  // Python's int32 increment wraps to -2^31 here, a value no loader accepts; amp saturates.
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  auto dict = python_style_dict();
  dict.insert_or_assign("growth_interval", int64_t{2000});
  dict.insert_or_assign("_growth_tracker", kMax - 1);
  auto scaler = cpu_scaler();
  scaler.load_state_dict(dict);
  for (int64_t expected : {kMax, kMax, kMax}) {
    amp_test::clean_iteration(scaler);
    CHECK(scaler.get_growth_tracker() == expected);
    CHECK(scaler.get_scale() == 128.0);  // no growth at the saturated tracker either
  }
  const auto path = temp_path("saturated_tracker.pt");
  scaler.save_state_dict(path.string());
  auto reloaded = cpu_scaler();
  REQUIRE_NOTHROW(reloaded.load_state_dict(path.string()));
  std::filesystem::remove(path);
  CHECK(reloaded.get_growth_tracker() == kMax);
  CHECK(reloaded.state_dict() == scaler.state_dict());
}

TEST_CASE("Counters loaded at 2^63-1 stay there, and the state saved then reloads",
          "[scaler][state]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const auto options = GradScalerOptions().init_scale(128.0).track_counters(true);
  auto dict = python_style_dict();
  dict.insert("_amp_steps_taken", kMax);
  dict.insert("_amp_steps_skipped", kMax);
  dict.insert("_amp_consecutive_skips", int64_t{0});
  auto scaler = cpu_scaler(options);
  scaler.load_state_dict(dict);
  amp_test::clean_iteration(scaler);
  const auto counters = scaler.counters();
  CHECK(counters.steps_taken == kMax);
  CHECK(counters.steps_skipped == kMax);
  CHECK(counters.consecutive_skips == 0);
  auto twin = cpu_scaler(options);
  REQUIRE_NOTHROW(twin.load_state_dict(scaler.state_dict()));
  CHECK(twin.state_dict() == scaler.state_dict());
}

TEST_CASE("set_growth_interval below the tracker warns, and growth then waits for an overflow",
          "[scaler][state]") {
  // torch.amp's rule grows only when tracker + 1 equals the interval, so a tracker already past
  // a lowered interval stops growth until an overflow resets it; amp keeps the rule and says so.
  auto scaler = cpu_scaler(GradScalerOptions().init_scale(128.0).growth_interval(100));
  for (int i = 0; i < 5; ++i) amp_test::clean_iteration(scaler);
  REQUIRE(scaler.get_growth_tracker() == 5);
  amp_test::WarningCollector warnings;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    scaler.set_growth_interval(5);
    scaler.set_growth_interval(3);
    scaler.set_growth_interval(6);  // above the tracker: no warning
  }
  REQUIRE(warnings.messages.size() == 2);
  CHECK_THAT(warnings.messages[1],
             Contains("the growth tracker is 5, at or above the new growth_interval=3"));
  CHECK_THAT(warnings.messages[1], Contains("will not grow again until an overflow"));
  scaler.set_growth_interval(3);
  for (int i = 0; i < 4; ++i) amp_test::clean_iteration(scaler);
  CHECK(scaler.get_scale() == 128.0);
  CHECK(scaler.get_growth_tracker() == 9);
  // An overflow resets the tracker; growth then resumes every 3 clean steps.
  auto param = make_param(1);
  torch::optim::SGD optimizer({param}, 0.0);
  scaler.scale(torch::ones({}));
  set_grad(param, torch::full({1}, std::numeric_limits<float>::infinity()));
  scaler.step(optimizer);
  scaler.update();
  CHECK(scaler.get_scale() == 64.0);
  for (int i = 0; i < 3; ++i) amp_test::clean_iteration(scaler);
  CHECK(scaler.get_scale() == 128.0);
  CHECK(scaler.get_growth_tracker() == 0);
}

TEST_CASE("A loaded scale below min_scale by less than float32's rounding is refused",
          "[scaler][state]") {
  // 0.9999999999999999 rounds to float32 1.0, but the scaler holds the loaded value itself until
  // its first scale() (get_scale() returns it, as Python's _init_scale): that value is checked.
  const auto bounded = GradScalerOptions().min_scale(1.0).max_scale(16777216.0).hysteresis(3);
  auto dict = python_style_dict();
  dict.insert_or_assign("scale", 0.9999999999999999);
  for (const bool trained : {false, true}) {
    CAPTURE(trained);
    auto scaler = trained ? trained_scaler(GradScalerOptions(bounded).init_scale(1024.0))
                          : cpu_scaler(bounded);
    const std::string before = observable_state(scaler);
    CHECK_THROWS_WITH(scaler.load_state_dict(dict),
                      Contains("'scale' must lie in [min_scale, max_scale]. Got "
                               "scale=0.99999999999999989 with min_scale=1"));
    CHECK(observable_state(scaler) == before);
  }
  // Just above max_scale: refused too.
  dict.insert_or_assign("scale", 16777216.000000002);
  auto scaler = cpu_scaler(bounded);
  CHECK_THROWS_WITH(scaler.load_state_dict(dict), Contains("max_scale=16777216"));
  // The same values as an initial scale.
  CHECK_THROWS_WITH(cpu_scaler(GradScalerOptions(bounded).init_scale(0.9999999999999999)),
                    Contains("The initial scale must lie in [min_scale, max_scale]"));
  // A scaler without bounds takes it, and holds exactly it until its first scale(), as Python.
  auto unbounded = cpu_scaler();
  dict.insert_or_assign("scale", 0.9999999999999999);
  unbounded.load_state_dict(dict);
  CHECK(unbounded.get_scale() == 0.9999999999999999);
  unbounded.scale(torch::ones({}));
  CHECK(unbounded.get_scale() == 1.0);
  // A bound float32 cannot hold: the scale at the float32 floor (float32(0.7) < 0.7) loads.
  auto floor = cpu_scaler(GradScalerOptions().min_scale(0.7).init_scale(1.0));
  dict.insert_or_assign("scale", static_cast<double>(0.7f));
  CHECK_NOTHROW(floor.load_state_dict(dict));
}
