// GradScaler's state: Python-compatible state_dict, all-or-nothing loading, files and archives.
#include <amp/detail/option_fields.h>
#include <amp/grad_scaler.h>

#include <cmath>
#include <fstream>
#include <optional>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "scaler/validate.h"
#include "serialize/mapped_file.h"
#include "serialize/state_file.h"

namespace amp {

namespace {

// Bumped when amp's extra keys change meaning; a dict from a newer amp is refused.
constexpr int64_t kFormatVersion = 1;
constexpr const char* kFormatKey = "_amp_format_version";
constexpr const char* kArchivePrefix = "grad_scaler.";

using StateDict = c10::Dict<std::string, c10::IValue>;

// Dict<_, IValue> has no default constructor: build the generic dict (str -> Any, what a Python
// dict of numbers is) and view it typed.
StateDict empty_state_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

std::optional<c10::IValue> find(const StateDict& dict, const std::string& key) {
  auto it = dict.find(key);
  if (it == dict.end()) return std::nullopt;
  return it->value();
}

c10::IValue require(const StateDict& dict, const std::string& key) {
  auto value = find(dict, key);
  TORCH_CHECK(value.has_value(), "GradScaler::load_state_dict: the state dict has no key '", key,
              "'; pass a dict returned by GradScaler.state_dict() (Python or C++).");
  return *value;
}

double as_float(const c10::IValue& value, const std::string& key) {
  // Python accepts an int where a float is stored (both are numbers there); so do we.
  TORCH_CHECK(value.isDouble() || value.isInt(), "GradScaler::load_state_dict: '", key,
              "' must be a float, got a value of type ", value.tagKind(),
              "; pass a dict returned by GradScaler.state_dict().");
  return value.isDouble() ? value.toDouble() : static_cast<double>(value.toInt());
}

int64_t as_int(const c10::IValue& value, const std::string& key) {
  TORCH_CHECK(value.isInt(), "GradScaler::load_state_dict: '", key,
              "' must be an int, got a value of type ", value.tagKind(),
              "; pass a dict returned by GradScaler.state_dict().");
  return value.toInt();
}

bool as_bool(const c10::IValue& value, const std::string& key) {
  TORCH_CHECK(value.isBool(), "GradScaler::load_state_dict: '", key,
              "' must be a bool, got a value of type ", value.tagKind(),
              "; pass a dict returned by GradScaler.state_dict().");
  return value.toBool();
}

// An option's value as the IValue its state-dict key holds (OptionField::Kind says which).
c10::IValue option_value(const detail::OptionField& field, const GradScalerOptions& options) {
  const double value = field.get(options);
  switch (field.kind) {
    case detail::OptionField::Kind::kInt:
    case detail::OptionField::Kind::kPolicy:
      return static_cast<int64_t>(value);
    case detail::OptionField::Kind::kBool:
      return value != 0.0;
    case detail::OptionField::Kind::kFloat:
      break;
  }
  return value;
}

// A loaded option key, checked for the type its field keeps.
double as_number(const c10::IValue& value, const detail::OptionField& field) {
  switch (field.kind) {
    case detail::OptionField::Kind::kInt:
    case detail::OptionField::Kind::kPolicy: {
      // Fields travel as doubles: beyond 2^53 an int would not come back as itself.
      const int64_t i = as_int(value, field.state_key);
      TORCH_CHECK(i >= -(int64_t{1} << 53) && i <= (int64_t{1} << 53),
                  "GradScaler::load_state_dict: '", field.state_key, "' is ", i,
                  ", far outside the range of ", field.name, "; the checkpoint is damaged.");
      return static_cast<double>(i);
    }
    case detail::OptionField::Kind::kBool:
      return as_bool(value, field.state_key) ? 1.0 : 0.0;
    case detail::OptionField::Kind::kFloat:
      break;
  }
  return as_float(value, field.state_key);
}

// torch.save's zip format holding `value`. torch::pickle_save tags a typed dict with
// torch.jit._pickle.restore_type_tag, which Python's torch.load(weights_only=True) refuses; a
// plain dict of numbers is what Python itself writes, so the pickle is made without type tags.
std::vector<char> python_file_bytes(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) { pickle.insert(pickle.end(), bytes, bytes + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> file;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
      const char* begin = static_cast<const char*>(bytes);
      file.insert(file.end(), begin, begin + size);
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                       writer);
    writer.writeEndOfFile();
  }
  return file;
}

}  // namespace

c10::Dict<std::string, c10::IValue> GradScaler::state_dict() const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "state_dict");
  StateDict dict = empty_state_dict();
  if (!options_.enabled()) return dict;
  // Python's five keys and types.
  dict.insert("scale", get_scale());
  dict.insert("growth_factor", options_.growth_factor());
  dict.insert("backoff_factor", options_.backoff_factor());
  dict.insert("growth_interval", options_.growth_interval());
  dict.insert("_growth_tracker", get_growth_tracker());
  if (!uses_extensions()) return dict;
  // amp's extension state; Python's load_state_dict ignores these keys.
  dict.insert(kFormatKey, kFormatVersion);
  for (const detail::OptionField& field : detail::option_fields()) {
    if (field.state_key != nullptr) dict.insert(field.state_key, option_value(field, options_));
  }
  dict.insert("_amp_hysteresis_remaining", hysteresis_remaining());
  if (options_.track_counters()) {
    const GradScalerCounters c = counters();
    dict.insert("_amp_steps_taken", c.steps_taken);
    dict.insert("_amp_steps_skipped", c.steps_skipped);
    dict.insert("_amp_consecutive_skips", c.consecutive_skips);
  }
  return dict;
}

void GradScaler::load_state_dict(const c10::Dict<std::string, c10::IValue>& state_dict) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "load_state_dict");
  if (!options_.enabled()) return;
  // Python's wording.
  TORCH_CHECK(!state_dict.empty(),
              "The source state dict is empty, possibly because it was saved from a disabled "
              "instance of GradScaler.");

  // Parse and validate everything before changing anything (all or nothing).
  if (auto version = find(state_dict, kFormatKey)) {
    const int64_t v = as_int(*version, kFormatKey);
    TORCH_CHECK(v <= kFormatVersion, "GradScaler::load_state_dict: the state dict has format ",
                "version ", v, " but this amp reads versions up to ", kFormatVersion,
                "; load it with a newer amp.");
  }
  const double scale = as_float(require(state_dict, "scale"), "scale");
  detail::check_scale_value(scale, "GradScaler::load_state_dict: 'scale'", "scale",
                            "the checkpoint is damaged or was saved after the scale diverged.");
  const double growth_factor = as_float(require(state_dict, "growth_factor"), "growth_factor");
  detail::check_growth_factor(growth_factor);
  const double backoff_factor = as_float(require(state_dict, "backoff_factor"), "backoff_factor");
  detail::check_backoff_factor(backoff_factor);
  const int64_t growth_interval = as_int(require(state_dict, "growth_interval"), "growth_interval");
  detail::check_growth_interval(growth_interval);
  const int64_t tracker = as_int(require(state_dict, "_growth_tracker"), "_growth_tracker");
  detail::check_growth_tracker(tracker);

  // Extension keys are optional (Python's dicts lack them): absent ones keep the current value.
  GradScalerOptions options = options_;
  for (const detail::OptionField& field : detail::option_fields()) {
    if (field.state_key == nullptr) continue;
    if (auto v = find(state_dict, field.state_key)) field.set(options, as_number(*v, field));
  }
  // Bounds are checked against the loaded scale so a bounded scaler never starts outside them.
  detail::check_extension_options(options.hysteresis(), options.min_scale(), options.max_scale());
  detail::check_scale_in_bounds(scale, options.min_scale(), options.max_scale(),
                                detail::ScaleHeld::kExactThenRounded,
                                "GradScaler::load_state_dict: 'scale'", "scale",
                                "the checkpoint was saved with other bounds or is damaged.");
  int64_t remaining = options.hysteresis();
  if (auto v = find(state_dict, "_amp_hysteresis_remaining")) {
    remaining = as_int(*v, "_amp_hysteresis_remaining");
    TORCH_CHECK(remaining >= 0 && remaining <= options.hysteresis(),
                "GradScaler::load_state_dict: '_amp_hysteresis_remaining' must be in [0, ",
                options.hysteresis(), "], got ", remaining, "; the checkpoint is damaged.");
  }
  std::optional<GradScalerCounters> counters;
  if (options_.track_counters() && find(state_dict, "_amp_steps_taken")) {
    counters = GradScalerCounters{
        as_int(require(state_dict, "_amp_steps_taken"), "_amp_steps_taken"),
        as_int(require(state_dict, "_amp_steps_skipped"), "_amp_steps_skipped"),
        as_int(require(state_dict, "_amp_consecutive_skips"), "_amp_consecutive_skips")};
    TORCH_CHECK(counters->steps_taken >= 0 && counters->steps_skipped >= 0 &&
                    counters->consecutive_skips >= 0 &&
                    counters->consecutive_skips <= counters->steps_skipped,
                "GradScaler::load_state_dict: the counters must be >= 0 with consecutive skips <= "
                "skipped steps, got steps_taken=",
                counters->steps_taken, ", steps_skipped=", counters->steps_skipped,
                ", consecutive_skips=", counters->consecutive_skips,
                "; the checkpoint is damaged.");
  }

  // Commit. As in Python, the loaded values are also those a lazy init starts from.
  options.init_scale(scale);
  options.growth_factor(growth_factor);
  options.backoff_factor(backoff_factor);
  options.growth_interval(growth_interval);
  options_ = options;
  init_growth_tracker_ = tracker;
  // With hysteresis 1 no allowance is carried (every overflow backs off): it reads 1, whatever
  // in [0, 1] the dict held, so the state read back is the one in effect.
  if (options.hysteresis() == 1) remaining = 1;
  init_hysteresis_remaining_ = remaining;
  if (counters) init_counters_ = *counters;
  if (scale_.defined()) {
    scale_.fill_(scale);
    growth_tracker_.fill_(tracker);
    if (options_.hysteresis() > 1) {
      if (!hysteresis_remaining_.defined()) {
        hysteresis_remaining_ = at::empty({}, growth_tracker_.options());
      }
      hysteresis_remaining_.fill_(remaining);
    } else {
      hysteresis_remaining_ = at::Tensor();
    }
    if (counters) {
      counters_.copy_(
          at::tensor({counters->steps_taken, counters->steps_skipped, counters->consecutive_skips},
                     at::TensorOptions().dtype(at::kLong)));
    }
  }
}

void GradScaler::load_state_dict(const c10::impl::GenericDict& state_dict) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "load_state_dict");
  StateDict typed = empty_state_dict();
  for (const auto& entry : state_dict) {
    TORCH_CHECK(entry.key().isString(),
                "GradScaler::load_state_dict: state dict keys must be strings, got a key of type ",
                entry.key().tagKind(), "; pass a dict returned by GradScaler.state_dict().");
    typed.insert(entry.key().toStringRef(), entry.value());
  }
  load_state_dict(typed);
}

void GradScaler::load_state_dict(const c10::IValue& state_dict) {
  TORCH_CHECK(state_dict.isGenericDict(), "GradScaler::load_state_dict: the state is a ",
              state_dict.tagKind(),
              " rather than a dict; pass what GradScaler.state_dict() or scaler.state_dict() "
              "saved (a checkpoint's \"scaler\" entry).");
  load_state_dict(state_dict.toGenericDict());
}

void GradScaler::load_state_dict(const char* path) { load_state_dict(std::string(path)); }

void GradScaler::save_state_dict(const std::string& path) const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "save_state_dict");
  const std::vector<char> bytes = python_file_bytes(c10::IValue(state_dict()));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out.good(), "GradScaler::save_state_dict: cannot open '", path,
              "' for writing; check that the directory exists and is writable.");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  TORCH_CHECK(out.good(), "GradScaler::save_state_dict: writing '", path,
              "' failed; check free disk space and permissions.");
}

void GradScaler::load_state_dict(const std::string& path) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "load_state_dict");
  // amp's own strict reader, never LibTorch's general one: a damaged or hostile file is refused
  // with a sentence instead of crashing, hanging or exhausting memory inside the unpickler.
  std::optional<detail::MappedFile> file;
  try {
    file.emplace(path, detail::kMaxStateFileSize, "a state file");
  } catch (const detail::ReaderError& e) {
    TORCH_CHECK(false, "GradScaler::load_state_dict: ", e.what(),
                "; name a GradScaler state file (about 1.3 KiB, written by "
                "torch.save(scaler.state_dict(), path) or GradScaler::save_state_dict).");
  }
  detail::StateEntries entries;
  try {
    entries = detail::parse_state_file(file->bytes());
  } catch (const detail::ReaderError& e) {
    TORCH_CHECK(false, "GradScaler::load_state_dict: '", path,
                "' is not a readable state dict file (corrupt, truncated, or not written by "
                "torch.save(scaler.state_dict(), path) / GradScaler::save_state_dict): ",
                e.what());
  }
  StateDict dict = empty_state_dict();
  for (const auto& [key, value] : entries) {
    switch (value.kind) {
      case detail::StateValue::Kind::kFloat:
        dict.insert(key, value.f);
        break;
      case detail::StateValue::Kind::kInt:
        dict.insert(key, value.i);
        break;
      case detail::StateValue::Kind::kBool:
        dict.insert(key, value.b);
        break;
    }
  }
  load_state_dict(dict);
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "save");
  // Saving the scaler itself is Python's pickling of the object, which refuses a half-done
  // iteration: its per-optimizer flags would be lost.
  TORCH_CHECK(!options_.enabled() || per_optimizer_states_.empty(),
              "A GradScaler instance may only be pickled at the beginning of an iteration, or at "
              "the end after scaler.update(). Call update() before saving the scaler.");
  for (const auto& entry : state_dict()) {
    archive.write(kArchivePrefix + entry.key(), entry.value());
  }
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  const detail::ConcurrentUseDetector::Scope in_use(use_, "load");
  // The keys a disabled scaler wrote are none, which load_state_dict reports as Python does.
  StateDict dict = empty_state_dict();
  const std::string prefix = kArchivePrefix;
  for (const std::string& key : archive.keys()) {
    if (key.rfind(prefix, 0) != 0) continue;
    c10::IValue value;
    archive.read(key, value);
    dict.insert(key.substr(prefix.size()), value);
  }
  load_state_dict(dict);
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  scaler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

}  // namespace amp
