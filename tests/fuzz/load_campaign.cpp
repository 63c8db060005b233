// The load campaign: mutated scaler files of four kinds, each loaded into four scalers in a child
// process, which must refuse cleanly (scaler unchanged) or accept a state a scaler can train in;
// mutated model state dicts (Python's and amp's), each loaded into four models the same way; and
// mutated optimizer state dicts (Python's and amp's), each loaded into four optimizers.
//
//   amp_load_campaign --python PY --files N [--seed S] [--raw] [--keep DIR]
//   amp_load_campaign --write-seeds DIR      (the archive fuzz target's seed corpus)
//   amp_load_campaign --replay KIND FILE     (one kept input, in this process, saying why)
//
// Kinds: a C++ save_state_dict file; Python's torch.save(scaler.state_dict()) with a float and
// with an int scale; a torch::save(scaler) archive; a checkpoint archive (model, optimizer,
// scaler); Python's torch.save(model.state_dict()) and amp::save_state_dict's file of the same
// model, and of that model's state dict with values that hold themselves added (a list, a dict, a
// tuple through a list); Python's torch.save(AdamW(foreach=False).state_dict()) and amp's
// save_optimizer_state_dict of amp::optim::AdamW, two groups, after two steps. State files load
// with GradScaler::load_state_dict(path), archives with amp::load
// (--raw: LibTorch's torch::load, for comparison), model state dicts with amp::load_state_dict
// (also with --raw: LibTorch cannot read them), optimizer state dicts with
// amp::load_optimizer_state_dict into amp::optim::AdamW, LibTorch's AdamW and SGD, and FusedAdamW,
// each of which must then save, and step or raise ATen's error as Python's step does. Mutations:
// bit flips, byte runs, truncation, 32-bit fields set to 0 / 0xFFFFFFFF / 2^28, and edits inside a
// pickle with its CRC-32 fixed (special floats and ints, deep nesting, a memo index of 2^28, a 4 GB
// string length, an unterminated GLOBAL, an unknown storage type, a deeply nested type). Each child
// runs under a 10 s alarm and a 2 GiB address-space allowance above its start. Prints one line per
// outcome and exits 1 if any input crashed, hung, allocated over 1 GiB, changed a scaler it
// refused, or left a scaler that cannot save or train.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <amp/archive.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>
#include <amp/state_dict.h>

#include "serialize/reader_error.h"
#include "serialize/zip_directory.h"
#include "support/checkpoints.h"
#include "support/remove_tree.h"

namespace fs = std::filesystem;

namespace {

// A child exits with the number of scalers that accepted the file (0 to 4), or with:
enum Exit : int {
  kChanged = 10,          // a refused load changed the scaler
  kInvalidAccepted = 11,  // an accepted load left a scaler that cannot save or train
  kOtherException = 12,   // amp's reader threw something other than c10::Error
  kHarnessError = 13,     // the campaign itself failed (setting up the scalers)
};

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

amp::GradScalerOptions extended() {
  return amp::GradScalerOptions()
      .init_scale(4096.0)
      .hysteresis(3)
      .min_scale(1.0)
      .max_scale(65536.0)
      .track_counters(true);
}

// Runs `steps` iterations on a toy parameter, every third one with an inf gradient.
void train(amp::GradScaler& scaler, int steps) {
  auto param = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD optimizer({param}, 0.01);
  for (int k = 0; k < steps; ++k) {
    optimizer.zero_grad();
    scaler.scale((param * 2).sum()).backward();
    if (k % 3 == 2) param.mutable_grad()[0] = std::numeric_limits<float>::infinity();
    scaler.step(optimizer);
    scaler.update();
  }
  if (!torch::isfinite(param).all().item<bool>()) throw std::runtime_error("non-finite param");
}

// Everything a load may change, as text.
std::string snapshot(const amp::GradScaler& scaler) {
  std::ostringstream out;
  out.precision(17);
  for (const auto& item : scaler.state_dict()) out << item.key() << "=" << item.value() << ";";
  const auto& o = scaler.options();
  out << o.init_scale() << "," << o.growth_factor() << "," << o.backoff_factor() << ","
      << o.growth_interval() << "," << o.hysteresis() << "," << o.min_scale() << ","
      << o.max_scale() << "," << scaler.hysteresis_remaining();
  if (o.track_counters()) {
    const auto c = scaler.counters();
    out << "," << c.steps_taken << "," << c.steps_skipped << "," << c.consecutive_skips;
  }
  return out.str();
}

// Whether the scale (the loaded value before the first scale(), get_scale() returns it) is
// within [min_scale, max_scale], each bound also as its float32 rounding (the floor the update
// clamps to in float32 may lie just below a bound float32 cannot hold).
bool scale_in_bounds(const amp::GradScaler& scaler) {
  const auto& o = scaler.options();
  const double scale = scaler.get_scale();
  const double low =
      std::min(o.min_scale(), static_cast<double>(static_cast<float>(o.min_scale())));
  const double high =
      std::max(o.max_scale(), static_cast<double>(static_cast<float>(o.max_scale())));
  return scale >= low && scale <= high;
}

// The four scalers every file is loaded into: fresh, mid-training, with extensions after
// training, with extensions fresh. Made once; each child gets its own copy through fork.
std::vector<amp::GradScaler> make_scalers() {
  std::vector<amp::GradScaler> scalers;
  scalers.emplace_back(c10::DeviceType::CPU);
  scalers.emplace_back(c10::DeviceType::CPU, amp::GradScalerOptions().growth_interval(3));
  train(scalers.back(), 7);
  scalers.emplace_back(c10::DeviceType::CPU, extended());
  train(scalers.back(), 7);
  scalers.emplace_back(c10::DeviceType::CPU, extended());
  return scalers;
}

// The model the model-state files hold (Python writes the same one): Linear, LayerNorm, Linear,
// its values seeded by `seed`.
torch::nn::Sequential make_model(int seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(4, 8),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})),
                               torch::nn::Linear(8, 3));
}

// Every entry's name, dtype, shape and bytes.
std::string model_snapshot(const torch::nn::Module& model) {
  std::string out;
  for (const auto& entry : amp::state_dict(model)) {
    const at::Tensor t = entry.value().contiguous();
    out += entry.key() + c10::toString(t.scalar_type()) + std::to_string(t.dim()) + ":";
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  return out;
}

// The child's loop over four targets: `make(k)` builds target k, `snapshot` describes it, `load`
// loads the file into it and `use` exercises an accepted one (it throws if the target cannot be
// used). Returns how many accepted the file, or an Exit code: a refusal must leave the target's
// snapshot unchanged.
template <typename Make, typename Snapshot, typename Load, typename Use>
int load_into_four(bool verbose, Make make, Snapshot snapshot, Load load, Use use) {
  int accepted = 0;
  for (int k = 0; k < 4; ++k) {
    auto target = make(k);
    const std::string before = snapshot(target);
    try {
      load(target);
    } catch (const c10::Error& error) {
      if (verbose) std::printf("refused: %s\n", error.msg().c_str());
      if (snapshot(target) != before) return kChanged;
      continue;
    } catch (const std::exception& error) {
      if (verbose) std::printf("refused (%s)\n", error.what());
      return kOtherException;
    }
    try {
      use(target);
    } catch (const std::exception& error) {
      if (verbose) std::printf("target %d accepted, then failed: %s\n", k, error.what());
      return kInvalidAccepted;
    }
    ++accepted;
  }
  return accepted;
}

// The child for a model-state file: loads it into four models of other seeds, each of which must
// then run and save (values may be any floats: the pickle's edits keep the tensors' bytes, whose
// CRC-32 is checked).
int load_into_models(const fs::path& path, bool verbose) {
  return load_into_four(
      verbose, make_model, [](const auto& model) { return model_snapshot(*model); },
      [&](auto& model) { amp::load_state_dict(*model, path.string()); },
      [&](auto& model) {
        (void)model->forward(torch::ones({2, 4}));
        amp::save_state_dict(*model, path.string() + ".resaved");
      });
}

// The optimizers an optimizer file is loaded into (`which`: amp::optim::AdamW, LibTorch's AdamW,
// FusedAdamW, LibTorch's SGD): two groups ([weight], [bias] with its own lr and no weight decay)
// over a Linear(4, 3) seeded with `which`, one step taken so that each has a state.
struct OptimizerUnderTest {
  torch::nn::Linear model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

OptimizerUnderTest make_optimizer(int which) {
  torch::manual_seed(which);
  OptimizerUnderTest out{torch::nn::Linear(4, 3), nullptr};
  const auto groups = [&](auto second) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<at::Tensor>{out.model->weight});
    g.emplace_back(std::vector<at::Tensor>{out.model->bias}, std::move(second));
    return g;
  };
  using torch::optim::AdamWOptions;
  switch (which) {
    case 0:
      out.optimizer = std::make_unique<amp::optim::AdamW>(
          groups(std::make_unique<AdamWOptions>(AdamWOptions(0.5).weight_decay(0))),
          AdamWOptions(0.01));
      break;
    case 1:
      out.optimizer = std::make_unique<torch::optim::AdamW>(
          groups(std::make_unique<AdamWOptions>(AdamWOptions(0.5).weight_decay(0))),
          AdamWOptions(0.01));
      break;
    case 2:
      out.optimizer = std::make_unique<amp::optim::FusedAdamW>(
          groups(std::make_unique<amp::optim::FusedAdamWOptions>(
              amp::optim::FusedAdamWOptions(0.5).weight_decay(0))),
          amp::optim::FusedAdamWOptions(0.01));
      break;
    default:
      out.optimizer =
          std::make_unique<torch::optim::SGD>(groups(std::make_unique<torch::optim::SGDOptions>(
                                                  torch::optim::SGDOptions(0.5).momentum(0.5))),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  out.model->zero_grad();
  out.model->forward(torch::ones({2, 4})).sum().backward();
  out.optimizer->step();
  return out;
}

// The optimizer's whole archive (options and state) and the parameters' bytes.
std::string optimizer_snapshot(const OptimizerUnderTest& under_test) {
  torch::serialize::OutputArchive archive;
  under_test.optimizer->save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str() + model_snapshot(*under_test.model);
}

// The child for an optimizer file: loads it into the four optimizers, each of which must then
// save and step. The step may raise ATen's error where Python's step raises it for the same file
// (an lr of 3.4e38 makes the step size overflow float32: "value cannot be converted to type float
// without overflow", a std::runtime_error); a save that fails, or a crash, is a failure.
int load_into_optimizers(const fs::path& path, bool verbose) {
  return load_into_four(
      verbose, make_optimizer, optimizer_snapshot,
      [&](OptimizerUnderTest& t) { amp::load_optimizer_state_dict(*t.optimizer, path.string()); },
      [&](OptimizerUnderTest& t) {
        amp::save_optimizer_state_dict(*t.optimizer, path.string() + ".resaved");
        t.model->zero_grad();
        t.model->forward(torch::ones({2, 4})).sum().backward();
        try {
          t.optimizer->step();
        } catch (const std::exception& error) {
          if (verbose) std::printf("accepted; the step raised: %s\n", error.what());
        }
      });
}

// The child: loads `path` (of `kind`) into the scalers. Returns how many accepted it, or an
// Exit code.
int load_into_scalers(const fs::path& path, const std::string& kind, bool raw,
                      std::vector<amp::GradScaler>& scalers, bool verbose = false) {
  if (kind == "py-model" || kind == "cpp-model" || kind == "py-cyclic") {
    return load_into_models(path, verbose);
  }
  if (kind == "py-optim" || kind == "cpp-optim") return load_into_optimizers(path, verbose);
  int accepted = 0;
  bool other_exception = false;
  for (amp::GradScaler& scaler : scalers) {
    const std::string before = snapshot(scaler);
    try {
      if (kind == "state" || kind == "py-float" || kind == "py-int") {
        scaler.load_state_dict(path.string());
      } else if (kind == "archive") {
        raw ? torch::load(scaler, path.string()) : amp::load(scaler, path.string());
      } else {
        torch::serialize::InputArchive archive;
        if (raw) {
          archive.load_from(path.string());
        } else {
          archive = amp::load_archive(path.string());
        }
        archive >> scaler;
      }
    } catch (const c10::Error& error) {
      if (verbose) std::printf("refused: %s\n", error.msg().c_str());
      if (snapshot(scaler) != before) return kChanged;
      continue;
    } catch (const std::exception& error) {
      // LibTorch's reader (--raw) also throws std::out_of_range and parser errors.
      if (verbose) std::printf("refused (%s)\n", error.what());
      if (snapshot(scaler) != before) return kChanged;
      other_exception = other_exception || !raw;
      continue;
    }
    // Accepted: the scale the scaler holds lies inside its own bounds (as the update enforces
    // them, in float32), and the scaler must save its state and train without non-finite
    // parameters.
    if (!scale_in_bounds(scaler)) {
      if (verbose) std::printf("accepted out of bounds: %s\n", snapshot(scaler).c_str());
      return kInvalidAccepted;
    }
    try {
      scaler.save_state_dict((path.string() + ".resaved"));
      train(scaler, 4);
      const double scale = scaler.get_scale();
      if (!(scale > 0) || !std::isfinite(scale)) return kInvalidAccepted;
    } catch (const std::exception& error) {
      if (verbose) std::printf("accepted, then failed: %s\n", error.what());
      return kInvalidAccepted;
    }
    if (verbose) std::printf("accepted: %s\n", snapshot(scaler).c_str());
    ++accepted;
  }
  return other_exception ? kOtherException : accepted;
}

// ---- bases and mutations ----

struct Base {
  std::string kind;
  std::string bytes;
};

// Writes `script` to `file` and runs it with `python` and `args`.
void run_python(const std::string& python, const fs::path& file, const std::string& script,
                const std::string& args) {
  write_bytes(file, script);
  const std::string command = "\"" + python + "\" " + file.string() + " " + args;
  if (std::system(command.c_str()) != 0) throw std::runtime_error("cannot run " + command);
}

std::vector<Base> make_bases(const fs::path& dir, const std::string& python) {
  amp::GradScaler scaler(c10::DeviceType::CPU, extended());
  train(scaler, 5);
  std::vector<Base> bases;
  scaler.save_state_dict((dir / "state.pt").string());
  bases.push_back({"state", read_bytes(dir / "state.pt")});
  const std::string script =
      "import sys, torch\n"
      "s = torch.amp.GradScaler('cpu', init_scale=1024.0, growth_interval=3)\n"
      "s.scale(torch.ones(()))\n"
      "d = s.state_dict()\n"
      "torch.save(d, sys.argv[1])\n"
      "d['scale'] = int(d['scale'])\n"
      "torch.save(d, sys.argv[2])\n";
  run_python(python, dir / "make.py", script,
             (dir / "py-float.pt").string() + " " + (dir / "py-int.pt").string());
  bases.push_back({"py-float", read_bytes(dir / "py-float.pt")});
  bases.push_back({"py-int", read_bytes(dir / "py-int.pt")});
  torch::save(scaler, (dir / "archive.pt").string());
  bases.push_back({"archive", read_bytes(dir / "archive.pt")});
  bases.push_back({"checkpoint", amp_test::checkpoint_archive_bytes(scaler)});
  const std::string model_script =
      "import sys, torch\n"
      "torch.manual_seed(9)\n"
      "m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), "
      "torch.nn.Linear(8, 3))\n"
      "torch.save(m.state_dict(), sys.argv[1])\n";
  run_python(python, dir / "make_model.py", model_script, (dir / "py-model.pt").string());
  bases.push_back({"py-model", read_bytes(dir / "py-model.pt")});
  // The same state dict holding values that hold themselves (a list, a dict, a tuple through a
  // list), which Python's weights_only load builds and amp refuses.
  const std::string cyclic_script =
      "import sys, torch\n"
      "torch.manual_seed(9)\n"
      "m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), "
      "torch.nn.Linear(8, 3))\n"
      "sd = m.state_dict()\n"
      "loop = [sd['0.bias']]\n"
      "loop.append(loop)\n"
      "me = {'w': sd['2.bias']}\n"
      "me['me'] = me\n"
      "holder = []\n"
      "holder.append((holder,))\n"
      "sd['loop'], sd['me'], sd['holder'] = loop, me, holder\n"
      "torch.save(sd, sys.argv[1])\n";
  run_python(python, dir / "make_cyclic.py", cyclic_script, (dir / "py-cyclic.pt").string());
  bases.push_back({"py-cyclic", read_bytes(dir / "py-cyclic.pt")});
  amp::save_state_dict(*make_model(9), (dir / "cpp-model.pt").string());
  bases.push_back({"cpp-model", read_bytes(dir / "cpp-model.pt")});
  const std::string optimizer_script =
      "import sys, torch\n"
      "torch.manual_seed(9)\n"
      "m = torch.nn.Linear(4, 3)\n"
      "opt = torch.optim.AdamW([{'params': [m.weight]}, {'params': [m.bias], 'lr': 0.5, "
      "'weight_decay': 0.0}], lr=0.01, foreach=False)\n"
      "for _ in range(2):\n"
      "    m(torch.ones(2, 4)).sum().backward()\n"
      "    opt.step()\n"
      "torch.save(opt.state_dict(), sys.argv[1])\n";
  run_python(python, dir / "make_optim.py", optimizer_script, (dir / "py-optim.pt").string());
  bases.push_back({"py-optim", read_bytes(dir / "py-optim.pt")});
  OptimizerUnderTest amp_adamw = make_optimizer(0);
  amp::save_optimizer_state_dict(*amp_adamw.optimizer, (dir / "cpp-optim.pt").string());
  bases.push_back({"cpp-optim", read_bytes(dir / "cpp-optim.pt")});
  return bases;
}

void put_le32(std::string& bytes, std::size_t offset, std::uint32_t value) {
  for (int k = 0; k < 4; ++k) bytes[offset + k] = static_cast<char>((value >> (8 * k)) & 0xff);
}

// Replaces [begin, end) of the stored pickle entry `entry` with `text` and rewrites the zip
// around it (sizes, offsets and CRC-32 fixed), so that only the pickle is damaged.
std::string rebuild_zip_with(const std::string& file,
                             const std::vector<amp::detail::ZipEntry>& entries,
                             const amp::detail::ZipEntry& edited, const std::string& content) {
  // A minimal stored zip, as LibTorch's and Python's writers make (no ZIP64 records).
  std::string out, directory;
  for (const auto& entry : entries) {
    const std::string data =
        &entry == &edited ? content : file.substr(entry.data_offset, entry.compressed_size);
    const std::uint32_t crc = &entry == &edited ? amp::detail::crc32(content) : entry.crc32;
    const auto size = &entry == &edited ? content.size() : entry.size;
    std::string local(30, '\0');
    put_le32(local, 0, 0x04034b50);
    local[4] = 20;
    local[8] = static_cast<char>(entry.method);
    put_le32(local, 14, crc);
    put_le32(local, 18, static_cast<std::uint32_t>(data.size()));
    put_le32(local, 22, static_cast<std::uint32_t>(size));
    local[26] = static_cast<char>(entry.name.size() & 0xff);
    local[27] = static_cast<char>(entry.name.size() >> 8);
    std::string central(46, '\0');
    put_le32(central, 0, 0x02014b50);
    central[4] = 20;
    central[6] = 20;
    central[10] = static_cast<char>(entry.method);
    put_le32(central, 16, crc);
    put_le32(central, 20, static_cast<std::uint32_t>(data.size()));
    put_le32(central, 24, static_cast<std::uint32_t>(size));
    central[28] = local[26];
    central[29] = local[27];
    put_le32(central, 42, static_cast<std::uint32_t>(out.size()));
    out += local + entry.name + data;
    directory += central + entry.name;
  }
  std::string end(22, '\0');
  put_le32(end, 0, 0x06054b50);
  end[8] = end[10] = static_cast<char>(entries.size() & 0xff);
  end[9] = end[11] = static_cast<char>(entries.size() >> 8);
  put_le32(end, 12, static_cast<std::uint32_t>(directory.size()));
  put_le32(end, 16, static_cast<std::uint32_t>(out.size()));
  return out + directory + end;
}

std::string be_double(double value) {
  std::uint64_t bits;
  std::memcpy(&bits, &value, 8);
  std::string out(8, '\0');
  for (int k = 0; k < 8; ++k) out[k] = static_cast<char>((bits >> (8 * (7 - k))) & 0xff);
  return out;
}

// One mutated file from `base`; `label` names the mutation.
std::string mutate(const std::string& base, std::mt19937_64& rng, std::string& label) {
  std::string bytes = base;
  const auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  std::vector<amp::detail::ZipEntry> entries;
  try {
    entries = amp::detail::read_zip_directory(base, 0xfffe);
  } catch (const amp::detail::ReaderError&) {
  }
  const amp::detail::ZipEntry* pickle = nullptr;
  for (const auto& entry : entries) {
    if (entry.name.size() > 8 && entry.name.substr(entry.name.size() - 8) == "data.pkl") {
      pickle = &entry;
    }
  }
  const std::size_t choice = pick(pickle ? 12 : 4);
  switch (choice) {
    case 0: {
      label = "bit flips";
      for (std::size_t n = 1 + pick(4); n-- > 0;) bytes[pick(bytes.size())] ^= 1 << pick(8);
      return bytes;
    }
    case 1: {
      label = "byte run";
      const std::size_t at = pick(bytes.size());
      const std::size_t length = std::min(bytes.size() - at, 1 + pick(16));
      for (std::size_t k = 0; k < length; ++k) bytes[at + k] = static_cast<char>(rng());
      return bytes;
    }
    case 2:
      label = "truncation";
      return bytes.substr(0, pick(bytes.size()));
    case 3: {
      label = "32-bit field";
      const std::uint32_t values[] = {0u, 0xffffffffu, 1u << 28, 0x7fffffffu};
      put_le32(bytes, pick(bytes.size() - 4), values[pick(4)]);
      return bytes;
    }
    default:
      break;
  }
  // Edits inside data.pkl, the zip rebuilt around it.
  std::string content = base.substr(pickle->data_offset, pickle->size);
  const std::size_t body_end = content.size() - 1;  // before STOP
  switch (choice) {
    case 4: {
      label = "pickle: special float";
      // The last two sit just below the extended scalers' min_scale (1) and just above their
      // max_scale (65536): within float32's rounding of a bound, outside the bound.
      const double values[] = {
          1e39, 1e-50,  1e-320,  std::nan(""), INFINITY, -INFINITY,          -1.0,
          0.0,  3.4e38, 1.2e-38, 2.0,          0.5,      0.9999999999999999, 65536.00000000001};
      std::vector<std::size_t> floats;
      for (std::size_t k = 0; k + 9 <= body_end; ++k) {
        if (content[k] == 'G') floats.push_back(k);
      }
      if (floats.empty()) return bytes;
      content.replace(floats[pick(floats.size())] + 1, 8,
                      be_double(values[pick(std::size(values))]));
      break;
    }
    case 5: {
      label = "pickle: special int";
      const std::int64_t values[] = {-1,
                                     0,
                                     1,
                                     std::int64_t{1} << 31,
                                     std::int64_t{1} << 62,
                                     (std::int64_t{1} << 31) - 1,
                                     -(std::int64_t{1} << 62)};
      std::vector<std::size_t> ints;
      for (std::size_t k = 0; k + 2 <= body_end; ++k) {
        if (content[k] == 'K') ints.push_back(k);
      }
      if (ints.empty()) return bytes;
      const std::int64_t value = values[pick(7)];
      std::string long1 = "\x8a\x08";
      for (int k = 0; k < 8; ++k) long1 += static_cast<char>((value >> (8 * k)) & 0xff);
      content.replace(ints[pick(ints.size())], 2, long1);
      break;
    }
    case 6:
      label = "pickle: lists nested deep";
      content.insert(body_end, std::string(200000, ']') + std::string(199999, 'a') + "0");
      break;
    case 7:
      label = "pickle: memo index 2^28";
      content.insert(body_end, std::string("r\x00\x00\x00\x10", 5));
      break;
    case 8:
      label = "pickle: 4 GB string";
      content.insert(body_end, std::string("X\xff\xff\xff\xff"
                                           "abc",
                                           8));
      break;
    case 9:
      label = "pickle: unterminated GLOBAL";
      content.insert(body_end, "c" + std::string(100000, 'x'));
      break;
    case 10: {
      label = "pickle: unknown storage or class";
      const auto at = content.find("Storage\n");
      if (at != std::string::npos) {
        content[at - 1] = 'Q';  // FloatStorage -> FloaQStorage
      } else {
        content.insert(body_end, "ctorch\nUnknownStorage\n0");
      }
      break;
    }
    default: {
      label = "pickle: nested type tag";
      std::string type;
      for (int k = 0; k < 100000; ++k) type += "List[";
      type += "int" + std::string(100000, ']');
      std::string length(4, '\0');
      put_le32(length, 0, static_cast<std::uint32_t>(type.size()));
      content.insert(body_end,
                     "ctorch.jit._pickle\nrestore_type_tag\n]X" + length + type + "\x86R0");
      break;
    }
  }
  return rebuild_zip_with(base, entries, *pickle, content);
}

int write_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  amp::GradScaler scaler(c10::DeviceType::CPU, extended());
  train(scaler, 5);
  torch::save(scaler, (dir / "scaler_archive.pt").string());
  write_bytes(dir / "checkpoint.pt", amp_test::checkpoint_archive_bytes(scaler));
  torch::save(std::vector<torch::Tensor>{torch::arange(6).reshape({2, 3}).t(),
                                         torch::ones({2}, torch::kHalf)},
              (dir / "tensors.pt").string());
  // Pickles and code alone, for the target's direct paths.
  const std::string checkpoint = read_bytes(dir / "checkpoint.pt");
  for (const auto& entry : amp::detail::read_zip_directory(checkpoint, 0xfffe)) {
    const bool pickle = entry.name.find("data.pkl") != std::string::npos;
    const bool code = entry.name.find("___torch_mangle_7.py") != std::string::npos;
    if ((pickle || code) && entry.method == 0) {
      write_bytes(dir / (pickle ? "checkpoint_data.pkl" : "checkpoint_code.py"),
                  checkpoint.substr(entry.data_offset, entry.size));
    }
  }
  std::printf("wrote seeds to %s\n", dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // One thread: the children are forked, and a forked OpenMP pool can deadlock.
  torch::set_num_threads(1);
  std::string python = "python3";
  std::size_t files = 1000;
  std::uint64_t seed = 1;
  bool raw = false;
  fs::path keep;
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    const auto next = [&]() -> std::string {
      if (k + 1 >= argc) {
        std::fprintf(stderr, "amp_load_campaign: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++k];
    };
    if (arg == "--write-seeds") return write_seeds(next());
    if (arg == "--replay") {
      const std::string kind = next();
      const fs::path file = next();
      std::vector<amp::GradScaler> scalers = make_scalers();
      const int result = load_into_scalers(file, kind, raw, scalers, /*verbose=*/true);
      std::printf(
          "result: %d (0-4: scalers that accepted it; 10 changed on refusal, 11 invalid "
          "accepted, 12 other exception)\n",
          result);
      return result > 4 ? 1 : 0;
    }
    if (arg == "--python") {
      python = next();
    } else if (arg == "--files") {
      files = std::stoul(next());
    } else if (arg == "--seed") {
      seed = std::stoull(next());
    } else if (arg == "--raw") {
      raw = true;
    } else if (arg == "--keep") {
      keep = next();
    } else {
      std::fprintf(stderr, "amp_load_campaign: unknown argument '%s' (see the file's header)\n",
                   arg.c_str());
      return 2;
    }
  }
  const fs::path dir =
      fs::temp_directory_path() / ("amp_load_campaign_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::vector<Base> bases = make_bases(dir, python);
  std::vector<amp::GradScaler> scalers = make_scalers();
  if (!keep.empty()) fs::create_directories(keep);

  struct Tally {
    std::size_t files = 0, loads_accepted = 0, crashed = 0, hung = 0, big = 0, changed = 0,
                invalid = 0, other = 0;
  };
  std::map<std::string, Tally> by_kind;
  std::map<std::string, std::size_t> failures_by_mutation;
  std::mt19937_64 rng(seed);
  bool failed = false;
  for (std::size_t n = 0; n < files; ++n) {
    const Base& base = bases[n % bases.size()];
    std::string label;
    const std::string bytes = mutate(base.bytes, rng, label);
    const fs::path path = dir / ("input_" + base.kind + ".pt");
    write_bytes(path, bytes);
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
      alarm(10);
#ifndef __SANITIZE_ADDRESS__  // ASan reserves terabytes of shadow memory and enforces its own
                              // limits
      rlimit limit{};
      getrlimit(RLIMIT_AS, &limit);
      std::ifstream status("/proc/self/statm");
      std::size_t pages = 0;
      status >> pages;
      const rlim_t allowance =
          static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (rlim_t{2} << 30);
      limit.rlim_cur = allowance;
      setrlimit(RLIMIT_AS, &limit);
#endif
      try {
        _exit(load_into_scalers(path, base.kind, raw, scalers));
      } catch (const std::exception& error) {
        std::fprintf(stderr, "amp_load_campaign: the harness failed: %s\n", error.what());
        _exit(kHarnessError);
      }
    }
    int status = 0;
    rusage usage{};
    wait4(child, &status, 0, &usage);
    Tally& tally = by_kind[base.kind];
    ++tally.files;
    std::string outcome;
    if (WIFSIGNALED(status)) {
      outcome = WTERMSIG(status) == SIGALRM
                    ? "hung"
                    : "crashed (" + std::string(strsignal(WTERMSIG(status))) + ")";
      ++(WTERMSIG(status) == SIGALRM ? tally.hung : tally.crashed);
    } else if (WEXITSTATUS(status) == kChanged) {
      outcome = "changed";
      ++tally.changed;
    } else if (WEXITSTATUS(status) == kInvalidAccepted) {
      outcome = "invalid";
      ++tally.invalid;
    } else if (WEXITSTATUS(status) == kOtherException) {
      outcome = "other-exception";
      ++tally.other;
    } else if (WEXITSTATUS(status) > 4) {
      outcome = "harness-error";
      ++tally.other;
    } else {
      tally.loads_accepted += static_cast<std::size_t>(WEXITSTATUS(status));
    }
    // ru_maxrss is in KiB; the parent's own footprint is shared and small next to 1 GiB.
    if (usage.ru_maxrss > (1 << 20)) {
      outcome += outcome.empty() ? "big" : "+big";
      ++tally.big;
    }
    if (!outcome.empty()) {
      failed = true;
      ++failures_by_mutation[base.kind + " / " + label + " -> " + outcome];
      if (!keep.empty()) write_bytes(keep / (base.kind + "_" + std::to_string(n) + ".pt"), bytes);
    }
  }
  std::printf("amp_load_campaign: %zu files, seed %llu, loaded with %s\n", files,
              static_cast<unsigned long long>(seed),
              raw ? "LibTorch's torch::load (--raw)" : "amp's readers");
  for (const auto& [kind, t] : by_kind) {
    std::printf(
        "  %-10s files %6zu  loads accepted %6zu of %6zu  crashed %zu  hung %zu  "
        "over-1GiB %zu  changed-on-refusal %zu  invalid-accepted %zu  other %zu\n",
        kind.c_str(), t.files, t.loads_accepted, 4 * t.files, t.crashed, t.hung, t.big, t.changed,
        t.invalid, t.other);
  }
  for (const auto& [what, count] : failures_by_mutation) {
    std::printf("  failure: %s: %zu\n", what.c_str(), count);
  }
  amp_test::remove_tree(dir);
  return failed ? 1 : 0;
}
