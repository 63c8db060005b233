// amp::load_pickled / save_pickled and the module state dicts on them: the archive checker and
// the torch.save pickle evaluator and writer (serialize/pickle_values.h, pickle_writer.h) joined
// to ATen tensors and IValues.
#include "amp/state_dict.h"

#include <amp/checkpoint.h>
#include <amp/optim/adam.h>
#include <amp/optim/lion.h>
#include <amp/optim/sgd.h>
#include <amp/optim/unfused_adam.h>
#include <amp/optim/wraps_optimizer.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#include "serialize/archive_check.h"
#include "serialize/open_checked.h"
#include "serialize/pickle_values.h"
#include "serialize/pickle_writer.h"
#include "serialize/zip_directory.h"

namespace amp {

namespace {

using detail::PickledTensor;
using detail::PickledValue;

// ---- dtypes: torch's names <-> ScalarType ----

const std::pair<const char*, c10::ScalarType> kDtypeNames[] = {
    {"float32", at::kFloat},
    {"float64", at::kDouble},
    {"float16", at::kHalf},
    {"bfloat16", at::kBFloat16},
    {"int64", at::kLong},
    {"int32", at::kInt},
    {"int16", at::kShort},
    {"int8", at::kChar},
    {"uint8", at::kByte},
    {"bool", at::kBool},
    {"complex64", at::kComplexFloat},
    {"complex128", at::kComplexDouble},
    {"float8_e4m3fn", at::kFloat8_e4m3fn},
    {"float8_e5m2", at::kFloat8_e5m2},
    {"float8_e4m3fnuz", at::kFloat8_e4m3fnuz},
    {"float8_e5m2fnuz", at::kFloat8_e5m2fnuz},
    {"float8_e8m0fnu", at::kFloat8_e8m0fnu},
    {"uint16", at::kUInt16},
    {"uint32", at::kUInt32},
    {"uint64", at::kUInt64},
};

std::optional<c10::ScalarType> scalar_type_named(const std::string& name) {
  for (const auto& [text, type] : kDtypeNames) {
    if (name == text) return type;
  }
  return std::nullopt;
}

const char* name_of(c10::ScalarType type) {
  for (const auto& [text, t] : kDtypeNames) {
    if (t == type) return text;
  }
  return nullptr;
}

// ---- reading ----

class PickledReader {
 public:
  PickledReader(const detail::MappedFile& file, const detail::ArchiveDirectory& archive)
      : mapped_(file), file_(file.bytes()), archive_(archive) {}

  c10::IValue convert(const PickledValue& value) {
    // A container the pickle references several times (memo) converts once and is shared, as
    // in Python: a pickle of lists that each hold the previous one twice stays linear.
    if (value.items) {
      const auto done = containers_.find(value.items.get());
      if (done != containers_.end()) return done->second;
      c10::IValue converted = convert_new(value);
      containers_.emplace(value.items.get(), converted);
      return converted;
    }
    return convert_new(value);
  }

 private:
  c10::IValue convert_new(const PickledValue& value) {
    using Kind = PickledValue::Kind;
    switch (value.kind) {
      case Kind::kNone:
        return c10::IValue();
      case Kind::kBool:
        return c10::IValue(value.integer != 0);
      case Kind::kInt:
        return c10::IValue(value.integer);
      case Kind::kFloat:
        return c10::IValue(value.real);
      case Kind::kString:
        return c10::IValue(value.text);
      case Kind::kTuple: {
        std::vector<c10::IValue> items;
        for (const PickledValue& item : *value.items) items.push_back(convert(item));
        return c10::ivalue::Tuple::create(std::move(items));
      }
      case Kind::kList: {
        c10::impl::GenericList list(c10::AnyType::get());
        for (const PickledValue& item : *value.items) list.push_back(convert(item));
        return list;
      }
      case Kind::kDict: {
        // String keys give Dict<str, Any> (a state_dict), int keys Dict<int, Any> (an optimizer's
        // state), mixed ones Dict<Any, Any>.
        bool all_strings = true, all_ints = true;
        for (std::size_t k = 0; k < value.items->size(); k += 2) {
          all_strings = all_strings && (*value.items)[k].kind == Kind::kString;
          all_ints = all_ints && (*value.items)[k].kind == Kind::kInt;
        }
        const c10::TypePtr key_type = all_strings ? c10::TypePtr(c10::StringType::get())
                                      : all_ints  ? c10::TypePtr(c10::IntType::get())
                                                  : c10::TypePtr(c10::AnyType::get());
        c10::impl::GenericDict dict(key_type, c10::AnyType::get());
        for (std::size_t k = 0; k < value.items->size(); k += 2) {
          dict.insert(convert((*value.items)[k]), convert((*value.items)[k + 1]));
        }
        return dict;
      }
      case Kind::kTensor:
        return tensor(*value.tensor);
    }
    return c10::IValue();
  }

  at::Tensor tensor(const PickledTensor& t) {
    const std::optional<c10::ScalarType> dtype = scalar_type_named(t.dtype);
    if (!dtype)
      throw detail::ReaderError("a tensor of dtype " + t.dtype + ", which LibTorch lacks");
    auto found = storages_.find(t.key);
    if (found == storages_.end()) {
      const std::string name = "data/" + t.key;
      const auto entry = archive_.by_name.find(name);
      // The checker has matched every record to a stored entry holding its elements.
      if (entry == archive_.by_name.end()) throw detail::ReaderError("no entry " + name);
      at::Tensor storage = at::empty({static_cast<int64_t>(t.storage_numel)}, at::dtype(*dtype));
      const std::uint64_t used = t.storage_numel * t.element_size;
      read_storage(archive_.entries[entry->second], name, storage, used);
      found = storages_.emplace(t.key, std::move(storage)).first;
    }
    if (found->second.scalar_type() != *dtype) {
      throw detail::ReaderError("the storage " + t.key + " is read as two dtypes");
    }
    // The checker bounded each view by its own record's count; a later record of the same key
    // may claim more elements than the first one read.
    if (t.storage_numel > static_cast<std::uint64_t>(found->second.numel())) {
      throw detail::ReaderError("the storage " + t.key + " is given " +
                                std::to_string(found->second.numel()) + " and then " +
                                std::to_string(t.storage_numel) + " elements");
    }
    at::Tensor view = found->second.as_strided(t.sizes, t.strides, t.offset);
    // Python's rebuilt tensor (an nn.Parameter's, say) requires grad as saved: a leaf that
    // shares the storage with the others of its key.
    if (t.requires_grad && (view.is_floating_point() || view.is_complex())) {
      view = view.detach().requires_grad_(true);
    }
    return view;
  }

  // Copies the first `used` bytes of `entry`'s contents into `storage`, its CRC-32 checked. A
  // stored entry (torch.save's tensors) is copied and checked piece by piece, each piece's
  // mapped pages given back once copied, so a tensor of several GiB is resident once, not twice.
  void read_storage(const detail::ZipEntry& entry, const std::string& name, at::Tensor& storage,
                    std::uint64_t used) {
    if (used > entry.size) throw detail::ReaderError("the entry " + name + " is too short");
    auto* out = static_cast<char*>(storage.data_ptr());
    if (entry.method != 0) {
      std::string inflated;
      const std::string_view bytes =
          detail::entry_bytes(file_, entry, detail::kNoFileSizeLimit, "a tensor's data", inflated);
      if (used > 0) std::memcpy(out, bytes.data(), used);
      return;
    }
    constexpr std::uint64_t kPiece = std::uint64_t{64} << 20;
    const std::string_view bytes = file_.substr(entry.data_offset, entry.size);
    std::uint32_t crc = 0;
    for (std::uint64_t at = 0; at < bytes.size(); at += kPiece) {
      const std::string_view piece = bytes.substr(at, kPiece);
      crc = detail::crc32(piece, crc);
      if (at < used)
        std::memcpy(out + at, piece.data(), std::min<std::uint64_t>(piece.size(), used - at));
      mapped_.release(piece);
    }
    if (crc != entry.crc32) {
      detail::fail_at(detail::kWholeFile, entry.data_offset, "zip entry ",
                      detail::quoted(entry.name), " has CRC-32 ", detail::hex(crc, 8),
                      " but the archive records ", detail::hex(entry.crc32, 8),
                      "; its bytes are damaged");
    }
  }

  const detail::MappedFile& mapped_;
  std::string_view file_;
  const detail::ArchiveDirectory& archive_;
  std::map<std::string, at::Tensor> storages_;     // by key: views of one storage share it
  std::map<const void*, c10::IValue> containers_;  // by PickledValue::items
};

[[noreturn]] void refuse_file(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, "cannot read '", path, "': ", what);
}

// ---- writing ----

class PickledWriter {
 public:
  PickledValue convert(const c10::IValue& value, const std::string& where) {
    using Kind = PickledValue::Kind;
    if (value.isNone()) return PickledValue{};
    if (value.isBool()) return detail::pickled_scalar(Kind::kBool, value.toBool());
    if (value.isInt()) return detail::pickled_scalar(Kind::kInt, value.toInt());
    if (value.isDouble()) return detail::pickled_scalar(Kind::kFloat, 0, value.toDouble());
    if (value.isString()) return detail::pickled_scalar(Kind::kString, 0, 0.0, value.toStringRef());
    PickledValue out;
    if (value.isTuple() || value.isList()) {
      out.kind = value.isTuple() ? Kind::kTuple : Kind::kList;
      out.items = std::make_shared<std::vector<PickledValue>>();
      const auto items =
          value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
      for (std::size_t k = 0; k < items.size(); ++k) {
        out.items->push_back(convert(items[k], where + "[" + std::to_string(k) + "]"));
      }
    } else if (value.isGenericDict()) {
      out.kind = Kind::kDict;
      out.items = std::make_shared<std::vector<PickledValue>>();
      for (const auto& entry : value.toGenericDict()) {
        const std::string key =
            entry.key().isString() ? entry.key().toStringRef() : entry.key().tagKind();
        out.items->push_back(convert(entry.key(), where + " key"));
        out.items->push_back(convert(entry.value(), where + "[" + key + "]"));
      }
    } else if (value.isTensor()) {
      out.kind = Kind::kTensor;
      out.tensor = tensor(value.toTensor(), where);
    } else {
      TORCH_CHECK(false, where, " is a ", value.tagKind(),
                  ", which torch.save's files hold only inside a pickled class; save dicts, "
                  "lists, tuples, numbers, strings and tensors");
    }
    return out;
  }

  /// The tensors' bytes, by key, in the order written.
  std::vector<std::pair<std::string, at::Tensor>> storages;

 private:
  std::shared_ptr<const PickledTensor> tensor(const at::Tensor& value, const std::string& where) {
    TORCH_CHECK(value.defined(), where, " is an undefined tensor, which Python has no form for");
    const char* dtype = name_of(value.scalar_type());
    TORCH_CHECK(dtype != nullptr, where, " has dtype ", value.scalar_type(),
                ", which torch.save has no record for");
    const at::Tensor bytes = value.detach().to(at::kCPU).contiguous();
    auto t = std::make_shared<PickledTensor>();
    t->key = std::to_string(storages.size());
    t->dtype = dtype;
    t->element_size = bytes.element_size();
    t->location = "cpu";
    t->storage_numel = static_cast<std::uint64_t>(bytes.numel());
    t->sizes = bytes.sizes().vec();
    t->strides = bytes.strides().vec();
    storages.emplace_back(t->key, bytes);
    return t;
  }
};

// Writes the archive to `path` through a file beside it, renamed over `path` when complete.
void write_archive(const std::string& path, const std::string& pickle,
                   const std::vector<std::pair<std::string, at::Tensor>>& storages) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(out, "cannot write '", partial, "': ", std::strerror(errno),
                "; check that the folder exists and is writable.");
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, std::size_t size) {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
      return out ? size : 0;
    });
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    const std::string byteorder = "little";
    writer.writeRecord("byteorder", byteorder.data(), byteorder.size());
    for (const auto& [key, bytes] : storages) {
      writer.writeRecord("data/" + key, bytes.data_ptr(),
                         static_cast<std::size_t>(bytes.numel()) * bytes.element_size());
    }
    writer.writeEndOfFile();
    out.flush();
    TORCH_CHECK(out, "cannot write '", partial, "': ", std::strerror(errno));
  }
  std::error_code error;
  std::filesystem::rename(partial, path, error);
  if (error) {
    std::filesystem::remove(partial);
    TORCH_CHECK(false, "cannot replace '", path, "': ", error.message());
  }
}

// Python's state_dict order: a module's parameters, then its buffers, then each child's. A
// CheckpointWrapper is transparent, as in its archives and in Python's checkpoint_wrapper state
// dicts: the wrapped module's entries stand at the wrapper's own name.
void collect(const torch::nn::Module& module, const std::string& prefix,
             std::vector<std::pair<std::string, at::Tensor>>& out) {
  if (dynamic_cast<const CheckpointWrapperImpl*>(&module) != nullptr) {
    for (const auto& child : module.named_children()) collect(*child.value(), prefix, out);
    return;
  }
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (item.value().defined()) out.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (item.value().defined()) out.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& child : module.named_children()) {
    collect(*child.value(), prefix + child.key() + ".", out);
  }
}

std::string shape_text(const at::Tensor& t) {
  std::ostringstream text;
  text << "[";
  for (int64_t d = 0; d < t.dim(); ++d) text << (d ? ", " : "") << t.size(d);
  text << "]";
  return text.str();
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string text;
  for (const std::string& key : keys) text += (text.empty() ? "\"" : ", \"") + key + "\"";
  return text;
}

// ---- module versions: what Python's modules do with old state dicts ----

// Each module's version as the state dict's `_metadata` records it (torch.save of a module's
// state_dict() writes one per module prefix: "" for the root, "1", "encoder.norm"). A plain dict,
// an IValue or a file without it has none, which Python reads as version None everywhere.
using ModuleVersions = std::map<std::string, int64_t>;

ModuleVersions module_versions(const PickledValue& root) {
  ModuleVersions versions;
  const auto find = [](const PickledValue& dict, const char* key) -> const PickledValue* {
    if (dict.kind != PickledValue::Kind::kDict) return nullptr;
    for (std::size_t k = 0; k + 1 < dict.items->size(); k += 2) {
      const PickledValue& name = (*dict.items)[k];
      if (name.kind == PickledValue::Kind::kString && name.text == key) {
        return &(*dict.items)[k + 1];
      }
    }
    return nullptr;
  };
  if (root.kind != PickledValue::Kind::kDict || !root.attributes) return versions;
  const PickledValue* metadata = find(*root.attributes, "_metadata");
  if (metadata == nullptr || metadata->kind != PickledValue::Kind::kDict) return versions;
  for (std::size_t k = 0; k + 1 < metadata->items->size(); k += 2) {
    const PickledValue& prefix = (*metadata->items)[k];
    const PickledValue* version = find((*metadata->items)[k + 1], "version");
    if (prefix.kind == PickledValue::Kind::kString && version != nullptr &&
        version->kind == PickledValue::Kind::kInt) {
      versions.emplace(prefix.text, version->integer);
    }
  }
  return versions;
}

// The modules LibTorch shares with Python whose _load_from_state_dict reads its version: the
// normalisation layers of Python's _NormBase (BatchNorm, InstanceNorm), whose running statistics
// and num_batches_tracked came in later versions.
struct NormLayer {
  bool instance_norm;
  bool track_running_stats;
};

// The first of `Impl` that `module` is, as a NormLayer.
template <typename... Impl>
std::optional<NormLayer> norm_layer_of(const torch::nn::Module& module, bool instance_norm) {
  std::optional<NormLayer> found;
  const auto take = [&](const auto* layer) {
    if (layer != nullptr) found = NormLayer{instance_norm, layer->options.track_running_stats()};
    return layer != nullptr;
  };
  (take(dynamic_cast<const Impl*>(&module)) || ...);
  return found;
}

std::optional<NormLayer> norm_layer(const torch::nn::Module& module) {
  using namespace torch::nn;
  if (auto batch_norm = norm_layer_of<BatchNorm1dImpl, BatchNorm2dImpl, BatchNorm3dImpl>(
          module, /*instance_norm=*/false)) {
    return batch_norm;
  }
  return norm_layer_of<InstanceNorm1dImpl, InstanceNorm2dImpl, InstanceNorm3dImpl>(
      module, /*instance_norm=*/true);
}

// Python's version rules for old state dicts, over the module tree as `collect` names it:
// - a norm layer that tracks running statistics and is below version 2 (or has none) keeps its
//   own num_batches_tracked when the state lacks it (the buffer came in version 2);
// - an InstanceNorm that does not track them, with no version, refuses running statistics in
//   the state with Python's sentence (before version 1 they were saved whatever the option).
// `kept` receives the entries the module keeps; `errors` Python's messages.
void apply_version_rules(const torch::nn::Module& module, const std::string& prefix,
                         const ModuleVersions& versions,
                         const std::map<std::string, at::Tensor>& given,
                         std::set<std::string>& kept, std::vector<std::string>& errors) {
  if (dynamic_cast<const CheckpointWrapperImpl*>(&module) != nullptr) {
    for (const auto& child : module.named_children()) {
      apply_version_rules(*child.value(), prefix, versions, given, kept, errors);
    }
    return;
  }
  if (const std::optional<NormLayer> norm = norm_layer(module)) {
    const auto found = versions.find(prefix.empty() ? prefix : prefix.substr(0, prefix.size() - 1));
    const std::optional<int64_t> version =
        found == versions.end() ? std::nullopt : std::optional<int64_t>(found->second);
    if ((!version || *version < 2) && norm->track_running_stats &&
        given.count(prefix + "num_batches_tracked") == 0) {
      kept.insert(prefix + "num_batches_tracked");
    }
    if (!version && norm->instance_norm && !norm->track_running_stats) {
      std::vector<std::string> stats;
      for (const char* name : {"running_mean", "running_var"}) {
        if (given.count(prefix + name) != 0) stats.push_back(prefix + name);
      }
      if (!stats.empty()) {
        std::string names;
        for (const std::string& key : stats)
          names += (names.empty() ? "\"" : " and \"") + key + "\"";
        // Python's class name: "torch::nn::InstanceNorm1dImpl" -> "InstanceNorm1d".
        std::string klass = module.name().substr(module.name().rfind(':') + 1);
        if (klass.size() > 4 && klass.compare(klass.size() - 4, 4, "Impl") == 0) {
          klass.resize(klass.size() - 4);
        }
        errors.push_back("Unexpected running stats buffer(s) " + names + " for " + klass +
                         " with track_running_stats=False. If state_dict is a checkpoint saved "
                         "before 0.4.0, this may be expected because " +
                         klass +
                         " does not track running stats by default since 0.4.0. Please remove "
                         "these keys from state_dict. If the running stats are actually needed, "
                         "instead set track_running_stats=True in " +
                         klass + " to enable them. See the documentation of " + klass +
                         " for details.");
      }
    }
  }
  for (const auto& child : module.named_children()) {
    apply_version_rules(*child.value(), prefix + child.key() + ".", versions, given, kept, errors);
  }
}

// A torch.save file's root value, as the evaluator built it (an OrderedDict's `_metadata`
// included) and converted to an IValue.
struct PickledFile {
  PickledValue root;
  c10::IValue value;
};

PickledFile read_pickled(const std::string& path) {
  const auto file = detail::open_checked(path, "a torch.save file", "amp::load_pickled",
                                         "name a file written by torch.save or amp::save_pickled.");
  try {
    const detail::ArchiveDirectory archive = detail::check_archive(file->bytes());
    std::string inflated;
    const auto byteorder = archive.by_name.find("byteorder");
    if (byteorder != archive.by_name.end()) {
      const std::string_view order = detail::entry_bytes(
          file->bytes(), archive.entries[byteorder->second], 64, "the byte order record", inflated);
      if (order != "little")
        refuse_file(path, "its tensors are " + std::string(order) +
                              "-endian; amp reads little-endian files");
    }
    const detail::ZipEntry& pickle_entry = archive.entries[archive.by_name.at("data.pkl")];
    PickledFile read;
    read.root = detail::evaluate_torch_pickle(
        detail::entry_bytes(file->bytes(), pickle_entry, detail::kMaxArchivePickleSize,
                            "the pickle", inflated),
        pickle_entry.name);
    PickledReader reader(*file, archive);
    read.value = reader.convert(read.root);
    return read;
  } catch (const detail::ReaderError& error) {
    refuse_file(path, std::string("not a file torch.save writes, or damaged: ") + error.what());
  } catch (const c10::Error& error) {
    // LibTorch refused a tensor the file describes: still this file's fault, and said as such.
    refuse_file(path, std::string("not a file torch.save writes, or damaged: ") +
                          error.what_without_backtrace());
  }
}

}  // namespace

c10::IValue load_pickled(const std::string& path) { return read_pickled(path).value; }

c10::IValue make_dict(std::initializer_list<std::pair<std::string, c10::IValue>> entries) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, value] : entries) {
    TORCH_CHECK(!dict.contains(name), "amp::make_dict: the key \"", name,
                "\" is given twice; each name holds one value.");
    dict.insert(name, value);
  }
  return dict;
}

c10::IValue dict_entry(const c10::IValue& dict, const std::string& name) {
  TORCH_CHECK(dict.isGenericDict(), "amp::dict_entry: the value is a ", dict.tagKind(),
              ", not a dict; pass what load_pickled read from a checkpoint dict.");
  const auto entries = dict.toGenericDict();
  std::string names;
  for (const auto& entry : entries) {
    TORCH_CHECK(entry.key().isString(), "amp::dict_entry: the dict has a ", entry.key().tagKind(),
                " key; a checkpoint dict is keyed by names.");
    if (entry.key().toStringRef() == name) return entry.value();
    names += (names.empty() ? "\"" : ", \"") + entry.key().toStringRef() + "\"";
  }
  TORCH_CHECK(false, "amp::dict_entry: the dict has no entry \"", name, "\"; it has ",
              names.empty() ? std::string("none") : names, ".");
}

void save_pickled(const c10::IValue& value, const std::string& path) {
  PickledWriter writer;
  const PickledValue root = writer.convert(value, "the value");
  std::string pickle;
  try {
    pickle = detail::write_torch_pickle(root);
  } catch (const detail::ReaderError& error) {
    TORCH_CHECK(false, "amp::save_pickled('", path, "'): ", error.what());
  }
  write_archive(path, pickle, writer.storages);
}

c10::Dict<std::string, at::Tensor> state_dict(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> entries;
  collect(module, "", entries);
  c10::Dict<std::string, at::Tensor> dict;
  for (auto& [name, tensor] : entries) dict.insert(name, tensor.detach());
  return dict;
}

namespace {

StateDictKeys load_state_dict_with_versions(torch::nn::Module& module, const c10::IValue& state,
                                            bool strict, const ModuleVersions& versions) {
  TORCH_CHECK(state.isGenericDict(), "load_state_dict: the state is a ", state.tagKind(),
              " rather than a dict of names to tensors (what torch.save(model.state_dict()) "
              "writes)");
  std::map<std::string, at::Tensor> given;
  std::vector<std::string> given_order;
  for (const auto& entry : state.toGenericDict()) {
    TORCH_CHECK(entry.key().isString() && entry.value().isTensor(),
                "load_state_dict: the state holds a ", entry.key().tagKind(), " key or a ",
                entry.value().tagKind(),
                " value; a module's state dict maps names (strings) to tensors");
    given.emplace(entry.key().toStringRef(), entry.value().toTensor());
    given_order.push_back(entry.key().toStringRef());
  }
  std::vector<std::pair<std::string, at::Tensor>> own;
  collect(module, "", own);
  std::set<std::string> kept;
  std::vector<std::string> version_errors;
  apply_version_rules(module, "", versions, given, kept, version_errors);
  if (!version_errors.empty()) {
    std::string message = "load_state_dict: Error(s) in loading state_dict:";
    for (const std::string& error : version_errors) message += " " + error;
    TORCH_CHECK(false, message, " The module is unchanged.");
  }
  StateDictKeys keys;
  std::set<std::string> own_names;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, source)
  for (const auto& [name, target] : own) {
    own_names.insert(name);
    const auto found = given.find(name);
    if (found == given.end()) {
      if (kept.count(name) == 0) keys.missing_keys.push_back(name);
      continue;
    }
    const at::Tensor& source = found->second;
    TORCH_CHECK(source.sizes() == target.sizes(), "load_state_dict: size mismatch for ", name,
                ": the state has shape ", shape_text(source), ", the module's is ",
                shape_text(target), "; the state is of another model or configuration.");
    TORCH_CHECK(source.scalar_type() == target.scalar_type(),
                "load_state_dict: dtype mismatch for ", name, ": the state has ",
                source.scalar_type(), ", the module's is ", target.scalar_type(),
                "; convert the module (module->to(dtype)) or the state "
                "before loading.");
    copies.emplace_back(target, source);
  }
  for (const std::string& name : given_order) {
    if (own_names.count(name) == 0) keys.unexpected_keys.push_back(name);
  }
  if (strict && (!keys.missing_keys.empty() || !keys.unexpected_keys.empty())) {
    std::string message = "load_state_dict: the state does not match the module's names.";
    if (!keys.missing_keys.empty()) {
      message += " Missing key(s): " + key_list(keys.missing_keys) + ".";
    }
    if (!keys.unexpected_keys.empty()) {
      message += " Unexpected key(s): " + key_list(keys.unexpected_keys) + ".";
    }
    TORCH_CHECK(false, message, " Pass strict = false to load the entries that match.");
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
  return keys;
}

}  // namespace

StateDictKeys load_state_dict(torch::nn::Module& module, const c10::IValue& state, bool strict) {
  return load_state_dict_with_versions(module, state, strict, ModuleVersions{});
}

void consume_prefix_in_state_dict_if_present(c10::IValue& state, const std::string& prefix) {
  TORCH_CHECK(state.isGenericDict(), "consume_prefix_in_state_dict_if_present: the state is a ",
              state.tagKind(), ", not a state dict (a dict of names to tensors).");
  auto dict = state.toGenericDict();
  std::vector<std::string> keys;
  for (const auto& item : dict) {
    TORCH_CHECK(item.key().isString(), "consume_prefix_in_state_dict_if_present: the state has a ",
                item.key().tagKind(), " key; a state dict's keys are names.");
    keys.push_back(item.key().toStringRef());
  }
  // Python's order of operations: each prefixed entry is popped and set under its new name (at
  // the end, or in place of an entry of that name).
  for (const std::string& key : keys) {
    if (key.rfind(prefix, 0) != 0) continue;
    c10::IValue value = dict.at(key);
    (void)dict.erase(key);  // one entry: the key came from this dict
    dict.insert_or_assign(key.substr(prefix.size()), std::move(value));
  }
}

StateDictKeys load_state_dict(torch::nn::Module& module, const std::string& path, bool strict) {
  const PickledFile file = read_pickled(path);
  try {
    return load_state_dict_with_versions(module, file.value, strict, module_versions(file.root));
  } catch (const c10::Error& error) {
    TORCH_CHECK(false, "'", path, "': ", error.msg());
  }
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  PickledWriter writer;
  PickledValue root;
  root.kind = PickledValue::Kind::kDict;
  root.ordered_dict = true;
  root.items = std::make_shared<std::vector<PickledValue>>();
  for (const auto& entry : state_dict(module)) {
    const std::string& name = entry.key();
    const at::Tensor& tensor = entry.value();
    root.items->push_back(detail::pickled_scalar(PickledValue::Kind::kString, 0, 0.0, name));
    root.items->push_back(writer.convert(tensor, name));
  }
  write_archive(path, detail::write_torch_pickle(root), writer.storages);
}

// ---- optimizers: Python's state_dict <-> LibTorch's optimizer archive layout ----

namespace {

// The options LibTorch's optimizers read as doubles, which Python may hold as ints
// (`weight_decay=0`); other ints (amp's `rounding_seed`, `state_dtype`) stay ints.
bool float_option(const std::string& key) {
  return key == "lr" || key == "eps" || key == "weight_decay" || key == "momentum" ||
         key == "dampening";
}

// An archive as the optimizer's load reads it: written, then read back.
torch::serialize::InputArchive reread(torch::serialize::OutputArchive& archive) {
  std::ostringstream bytes;
  archive.save_to(bytes);
  std::istringstream in(bytes.str());
  torch::serialize::InputArchive read;
  read.load_from(in);
  return read;
}

// Every entry of `archive` but nested archives, by name.
std::vector<std::pair<std::string, c10::IValue>> entries(torch::serialize::InputArchive& archive) {
  std::vector<std::pair<std::string, c10::IValue>> out;
  for (const std::string& key : archive.keys()) {
    c10::IValue value;
    if (archive.try_read(key, value) && !value.isObject()) out.emplace_back(key, value);
  }
  return out;
}

c10::impl::GenericDict string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// What a Python optimizer state_dict must be; `what` names the part for the message.
[[noreturn]] void refuse_optimizer_state(const std::string& what) {
  TORCH_CHECK(false, "load_optimizer_state_dict: ", what,
              "; the state is not an optimizer's state_dict() (a dict of \"state\" by parameter "
              "index and a list of \"param_groups\"). The optimizer is unchanged.");
}

// How `optimizer` names itself in messages, and what of Python's group options it computes:
// whether its weight decay is decoupled (AdamW) or L2 (Adam), where that applies; whether it can
// maximize; and which of Python's implementations computes its steps (`fused`: fused=True;
// otherwise the single-tensor path, or none to name for FusedLion).
struct OptimizerTraits {
  const char* name;
  std::optional<bool> decoupled_weight_decay;
  bool maximizes;
  std::optional<bool> fused;
  const char* family = nullptr;  // "Adam", "SGD", "Lion" (as group_family names them), or none
};

template <typename T>
bool is_a(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const T*>(&optimizer) != nullptr;
}

// The optimizer whose arithmetic `optimizer` runs: itself, or what it wraps
// (ZeroRedundancyOptimizer's inner optimizer).
const torch::optim::Optimizer& unwrapped(const torch::optim::Optimizer& optimizer) {
  const auto* wrapper = dynamic_cast<const amp::optim::WrapsOptimizer*>(&optimizer);
  return wrapper != nullptr ? unwrapped(wrapper->wrapped_optimizer()) : optimizer;
}

OptimizerTraits traits_of(const torch::optim::Optimizer& wrapper) {
  const torch::optim::Optimizer& optimizer = unwrapped(wrapper);
  // amp's unfused Adam/AdamW derive from LibTorch's, so they are asked first.
  if (is_a<amp::optim::FusedAdam>(optimizer))
    return {"amp::optim::FusedAdam", false, true, true, "Adam"};
  if (is_a<amp::optim::FusedAdamW>(optimizer))
    return {"amp::optim::FusedAdamW", true, true, true, "Adam"};
  if (is_a<amp::optim::FusedSGD>(optimizer)) return {"amp::optim::FusedSGD", {}, true, true, "SGD"};
  if (is_a<amp::optim::FusedLion>(optimizer))
    return {"amp::optim::FusedLion", {}, true, {}, "Lion"};
  if (is_a<amp::optim::Adam>(optimizer)) return {"amp::optim::Adam", false, false, false, "Adam"};
  if (is_a<amp::optim::AdamW>(optimizer)) return {"amp::optim::AdamW", true, false, false, "Adam"};
  if (is_a<torch::optim::Adam>(optimizer))
    return {"torch::optim::Adam", false, false, false, "Adam"};
  if (is_a<torch::optim::AdamW>(optimizer))
    return {"torch::optim::AdamW", true, false, false, "Adam"};
  if (is_a<torch::optim::SGD>(optimizer)) return {"torch::optim::SGD", {}, false, false, "SGD"};
  // Another optimizer: LibTorch's others have no maximize, and a group asking for it is refused.
  return {"this optimizer", {}, false, {}};
}

// A parameter's saved `step` (Python's one-element float tensor, or a number) as a count, refused
// with a sentence unless it is a whole number from 0 to 2^53.
int64_t step_count(const c10::IValue& value, int64_t index) {
  double count = 0;
  bool one_value = true;
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    one_value = t.numel() == 1 && !t.is_complex();
    if (one_value) count = t.item<double>();
  } else {
    count = value.isInt() ? static_cast<double>(value.toInt()) : value.toDouble();
  }
  TORCH_CHECK(one_value && std::isfinite(count) && count >= 0 && count <= 9007199254740992.0 &&
                  std::floor(count) == count,
              "load_optimizer_state_dict: the step of parameter ", index, " is ",
              one_value ? c10::str(count) : std::string("not one real number"),
              "; a step count is a whole number from 0 to 2^53. The optimizer is unchanged.");
  return static_cast<int64_t>(count);
}

// Refuses, before the optimizer's own load sees it, a state whose groups differ in count or size
// from the optimizer's, or that lists a parameter twice: LibTorch's load replaces earlier groups
// before it checks a later one, and a repeated index leaves a parameter with an empty state that
// the next save dereferences. Python checks the counts and sizes first too.
// Returns the optimizer's parameter at each listed index's position, as Python pairs them.
std::map<int64_t, at::Tensor> check_group_layout(const torch::optim::Optimizer& optimizer,
                                                 const c10::List<c10::IValue>& groups) {
  const auto& mine = optimizer.param_groups();
  TORCH_CHECK(groups.size() == mine.size(), "load_optimizer_state_dict: the checkpoint has ",
              groups.size(), " param groups but this optimizer has ", mine.size(),
              "; load a state of the same groups. The optimizer is unchanged.");
  std::map<int64_t, at::Tensor> param_of;
  std::map<int64_t, std::size_t> group_of;  // for the message on a repeated index
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!groups.get(g).isGenericDict()) refuse_optimizer_state("a param group is not a dict");
    const auto group = groups.get(g).toGenericDict();
    if (!group.contains("params") || !group.at("params").isList()) {
      refuse_optimizer_state("param group " + std::to_string(g) + " has no list \"params\"");
    }
    const auto params = group.at("params").toList();
    TORCH_CHECK(params.size() == mine[g].params().size(), "load_optimizer_state_dict: group ", g,
                " of the checkpoint has ", params.size(), " parameters but this optimizer's group ",
                g, " has ", mine[g].params().size(),
                "; load a state of the same groups. The optimizer is unchanged.");
    for (std::size_t j = 0; j < params.size(); ++j) {
      if (!params.get(j).isInt()) {
        refuse_optimizer_state("param group " + std::to_string(g) + " lists a non-int parameter");
      }
      const int64_t index = params.get(j).toInt();
      const bool fresh = param_of.emplace(index, mine[g].params()[j]).second;
      const auto where = group_of.emplace(index, g).first;
      TORCH_CHECK(fresh, "load_optimizer_state_dict: parameter index ", index,
                  " is listed twice in \"param_groups\" (in group ", where->second,
                  " and in group ", g,
                  "); each parameter is in one group once. The optimizer is unchanged.");
    }
  }
  return param_of;
}

// The optimizer type a Python param group is of, by the options only it has: "betas" and "eps"
// (Adam, AdamW), "betas" alone (Lion), "momentum" and "dampening" (SGD); null for another.
const char* group_family(const c10::impl::GenericDict& group) {
  if (group.contains("betas")) return group.contains("eps") ? "Adam" : "Lion";
  if (group.contains("momentum") && group.contains("dampening")) return "SGD";
  return nullptr;
}

// What each family's groups hold, for messages.
const char* family_keys(const char* family) {
  if (family == nullptr) return "none of \"betas\", \"momentum\" and \"dampening\"";
  if (std::strcmp(family, "Adam") == 0) return "\"betas\" and \"eps\"";
  if (std::strcmp(family, "Lion") == 0) return "\"betas\" without \"eps\"";
  return "\"momentum\" and \"dampening\"";
}

// Refuses a group of another optimizer type than `optimizer`'s before anything is loaded: its
// state has other names, which LibTorch's optimizers would fail on half way through.
void check_group_family(const OptimizerTraits& traits, const c10::impl::GenericDict& group,
                        std::size_t g) {
  if (traits.family == nullptr) return;
  const char* family = group_family(group);
  if (family != nullptr && std::strcmp(family, traits.family) == 0) return;
  TORCH_CHECK(
      false, "load_optimizer_state_dict: param group ", g, " of the state is of ",
      family == nullptr ? "another optimizer" : (std::string("an ") + family + " optimizer"),
      " (it has ", family_keys(family), ") but ", traits.name, " is an ", traits.family,
      " optimizer (its groups have ", family_keys(traits.family),
      "); load the state into an optimizer of the type that saved it. The optimizer is "
      "unchanged.");
}

// A group option as LibTorch's options read it: a number. Python keeps a tensor there when it
// was given one (`lr=torch.tensor(0.01)`) and reads it through _to_scalar, which takes any tensor
// of one element; amp takes its value (a float option as a double). Anything else is refused.
c10::IValue option_number(const c10::IValue& value, const std::string& name, std::size_t g) {
  if (!value.isTensor()) return value;
  const at::Tensor& t = value.toTensor();
  TORCH_CHECK(t.defined() && t.numel() == 1 && !t.is_complex(),
              "load_optimizer_state_dict: param group ", g, "'s \"", name, "\" is a tensor of ",
              t.defined() ? t.numel() : 0, t.defined() && t.is_complex() ? " complex" : "",
              " elements; an option is a number or a tensor of one real element (Python's "
              "_to_scalar). The optimizer is unchanged.");
  if (t.is_floating_point()) return c10::IValue(t.item<double>());
  if (t.scalar_type() == at::kBool) return c10::IValue(t.item<bool>());
  return c10::IValue(t.item<int64_t>());
}

// Python continues a group saved with fused=True with its fused kernel, and one without it with
// the single-tensor (or foreach) path: the two round differently, so a load that changes the
// arithmetic is said once per load.
void warn_if_other_arithmetic(const OptimizerTraits& traits, const c10::List<c10::IValue>& groups) {
  if (!traits.fused) return;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto group = groups.get(g).toGenericDict();
    if (!group.contains("fused") || !group.at("fused").isBool()) continue;
    const bool fused = group.at("fused").toBool();
    if (fused == *traits.fused) continue;
    TORCH_WARN("load_optimizer_state_dict: param group ", g, " was saved by Python's ",
               fused ? "fused=True" : "unfused (single-tensor or foreach)", " optimizer but ",
               traits.name, " continues it with ", *traits.fused ? "fused" : "single-tensor",
               " arithmetic, which rounds differently; load it into ",
               fused ? "amp's fused optimizer of that type (FusedAdamW, FusedAdam, FusedSGD)"
                     : "amp::optim::AdamW, amp::optim::Adam or LibTorch's SGD",
               " to continue bit for bit.");
    return;
  }
}

// The optimizer's state and options as they are, to put back when its own load fails half way:
// LibTorch's loads replace each state object and each group's options, never a tensor in place,
// so copies of the objects (sharing the tensors) are enough.
class OptimizerSnapshot {
 public:
  explicit OptimizerSnapshot(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
    for (const auto& [key, state] : optimizer.state()) state_.emplace_back(key, state->clone());
    for (const auto& group : optimizer.param_groups()) {
      options_.push_back(group.has_options() ? group.options().clone() : nullptr);
    }
  }
  void restore() {
    optimizer_.state().clear();
    for (auto& [key, state] : state_) optimizer_.state()[key] = std::move(state);
    auto& groups = optimizer_.param_groups();
    for (std::size_t g = 0; g < groups.size() && g < options_.size(); ++g) {
      if (options_[g]) groups[g].set_options(std::move(options_[g]));
    }
  }

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> state_;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options_;
};

// Refuses a group whose options ask for an update `optimizer` does not compute: loading it would
// continue the run with other arithmetic and no error.
void check_group_semantics(const OptimizerTraits& traits, const c10::impl::GenericDict& group,
                           std::size_t g) {
  for (const char* key : {"decoupled_weight_decay", "maximize"}) {
    TORCH_CHECK(!group.contains(key) || group.at(key).isBool() || group.at(key).isNone(),
                "load_optimizer_state_dict: param group ", g, "'s \"", key, "\" is a ",
                group.at(key).tagKind(),
                "; Python writes True or False there. The optimizer is unchanged.");
  }
  const auto flag = [&](const char* key) {
    return group.contains(key) && group.at(key).isBool() && group.at(key).toBool();
  };
  const bool has_decoupled =
      group.contains("decoupled_weight_decay") && group.at("decoupled_weight_decay").isBool();
  // Without weight decay Adam and AdamW compute the same update (Python's AdamW takes Adam's
  // groups then, as it forces the flag on).
  const bool decays = !group.contains("weight_decay") ||
                      !(group.at("weight_decay").isDouble() || group.at("weight_decay").isInt()) ||
                      group.at("weight_decay").toScalar().toDouble() != 0;
  if (traits.decoupled_weight_decay && has_decoupled && decays &&
      flag("decoupled_weight_decay") != *traits.decoupled_weight_decay) {
    const bool decoupled = flag("decoupled_weight_decay");
    TORCH_CHECK(false, "load_optimizer_state_dict: param group ", g,
                " of the state has decoupled_weight_decay=", decoupled ? "True" : "False",
                " (Python's ", decoupled ? "AdamW" : "Adam", ") but ", traits.name,
                "'s weight decay is ", decoupled ? "L2 (Adam's)" : "decoupled (AdamW's)",
                "; load it into ",
                decoupled ? "FusedAdamW or amp::optim::AdamW" : "FusedAdam or amp::optim::Adam",
                ". The optimizer is unchanged.");
  }
  TORCH_CHECK(!flag("maximize") || traits.maximizes, "load_optimizer_state_dict: param group ", g,
              " of the state has maximize=True, which ", traits.name,
              " cannot do (LibTorch's optimizers have no maximize); load it into amp's FusedAdam, "
              "FusedAdamW or FusedSGD. The optimizer is unchanged.");
}

}  // namespace

c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive written;
  optimizer.save(written);
  torch::serialize::InputArchive archive = reread(written);
  torch::serialize::InputArchive groups_archive, state_archive;
  archive.read("param_groups", groups_archive);
  archive.read("state", state_archive);
  at::Tensor group_count;
  groups_archive.read("param_groups/size", group_count);
  std::map<std::string, int64_t> index_of;  // a saved parameter key -> Python's index
  const OptimizerTraits traits = traits_of(optimizer);
  c10::impl::GenericList groups(c10::AnyType::get());
  for (int64_t g = 0; g < group_count.item<int64_t>(); ++g) {
    torch::serialize::InputArchive group_archive, options;
    groups_archive.read("param_groups/" + std::to_string(g), group_archive);
    group_archive.read("options", options);
    c10::impl::GenericDict group = string_dict();
    for (const auto& [key, value] : entries(options)) group.insert(key, value);
    // The implementation Python must pick to continue with the same arithmetic: amp's fused
    // optimizers are Python's fused=True ones, LibTorch's (and amp's unfused Adam/AdamW) Python's
    // single-tensor ones.
    if (traits.fused) {
      if (!*traits.fused) group.insert_or_assign("foreach", false);
      group.insert_or_assign("fused", *traits.fused);
    }
    // Python's Adam and AdamW are one class told apart by this option.
    if (traits.decoupled_weight_decay) {
      group.insert_or_assign("decoupled_weight_decay", *traits.decoupled_weight_decay);
    }
    at::Tensor param_count;
    group_archive.read("params/size", param_count);
    c10::impl::GenericList params(c10::IntType::get());
    for (int64_t j = 0; j < param_count.item<int64_t>(); ++j) {
      c10::IValue key;
      group_archive.read("params/" + std::to_string(j), key);
      const int64_t index = static_cast<int64_t>(index_of.size());
      index_of.emplace(key.toStringRef(), index);
      params.push_back(index);
    }
    group.insert("params", params);
    groups.push_back(group);
  }
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  for (const auto& [key, index] : index_of) {
    torch::serialize::InputArchive entry;
    if (!state_archive.try_read(key, entry)) continue;
    c10::impl::GenericDict fields = string_dict();
    for (const auto& [name, value] : entries(entry)) {
      if (value.isTensor() && !value.toTensor().defined()) continue;  // Python leaves it out
      if (name == "step" && value.isInt()) {
        fields.insert(name, at::scalar_tensor(static_cast<double>(value.toInt()), at::kFloat));
      } else {
        fields.insert(name, value);
      }
    }
    state.insert(index, fields);
  }
  // Python lists the state by index.
  c10::impl::GenericDict ordered(c10::IntType::get(), c10::AnyType::get());
  for (int64_t index = 0; index < static_cast<int64_t>(index_of.size()); ++index) {
    if (state.contains(index)) ordered.insert(index, state.at(index));
  }
  c10::impl::GenericDict result = string_dict();
  result.insert("state", ordered);
  result.insert("param_groups", groups);
  return result;
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state) {
  if (!state.isGenericDict()) refuse_optimizer_state("it is a " + state.tagKind());
  const auto dict = state.toGenericDict();
  if (!dict.contains("state") || !dict.at("state").isGenericDict()) {
    refuse_optimizer_state("it has no dict \"state\"");
  }
  if (!dict.contains("param_groups") || !dict.at("param_groups").isList()) {
    refuse_optimizer_state("it has no list \"param_groups\"");
  }
  torch::serialize::OutputArchive archive;
  const auto unit = archive.compilation_unit();
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  // Parameter keys as LibTorch's own optimizers write them (they parse them as numbers).
  const auto key_of = [](int64_t index) { return std::to_string(index); };

  // FusedLion counts its steps (for the rounding bits) but its update does not read the count;
  // lion-pytorch keeps no count, so its entries start counting at 0 here.
  const bool count_may_be_missing = is_a<amp::optim::FusedLion>(unwrapped(optimizer));
  const OptimizerTraits traits = traits_of(optimizer);
  const auto groups = dict.at("param_groups").toList();
  const std::map<int64_t, at::Tensor> param_of = check_group_layout(optimizer, groups);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto group = groups.get(g).toGenericDict();
    check_group_family(traits, group, g);
    check_group_semantics(traits, group, g);
  }
  // LibTorch's optimizers (and amp's unfused Adam/AdamW) take the state as it comes and would
  // fail in a later step(), after earlier parameters moved: their state is given Python's form
  // here, each floating tensor cast to its parameter's dtype and device, and refused unless it
  // has the parameter's shape. amp's fused optimizers check their state themselves (it may be
  // float32 master copies, or moments in another state_dtype).
  const bool python_form = traits.fused.has_value() && !*traits.fused;
  torch::serialize::OutputArchive state_archive(unit);
  for (const auto& item : dict.at("state").toGenericDict()) {
    if (!item.key().isInt() || !item.value().isGenericDict()) {
      refuse_optimizer_state("an entry of \"state\" is not a parameter index with a dict");
    }
    torch::serialize::OutputArchive entry(unit);
    bool any = false;
    for (const auto& field : item.value().toGenericDict()) {
      if (!field.key().isString()) refuse_optimizer_state("a state entry has a non-string key");
      const std::string& name = field.key().toStringRef();
      const c10::IValue& value = field.value();
      if (value.isNone()) continue;
      if (name == "step" && (value.isTensor() || value.isInt() || value.isDouble())) {
        // LibTorch's Adam counts steps in an int64; amp reads that too.
        entry.write(name, c10::IValue(step_count(value, item.key().toInt())));
      } else if (value.isTensor()) {
        at::Tensor tensor = value.toTensor();
        const auto param = param_of.find(item.key().toInt());
        if (python_form && param != param_of.end()) {
          TORCH_CHECK(tensor.sizes() == param->second.sizes(), "load_optimizer_state_dict: the ",
                      name, " of parameter ", item.key().toInt(), " has shape ", tensor.sizes(),
                      " but the parameter has ", param->second.sizes(),
                      "; the state is of another model. The optimizer is unchanged.");
          if (tensor.is_floating_point() || tensor.is_complex()) {
            tensor = tensor.to(param->second.device(), param->second.scalar_type());
          }
          // A file may give a tensor overlapping strides (0 where the shape is not 1), which
          // in-place updates refuse: the state is the tensor's values, laid out afresh.
          tensor = tensor.contiguous();
        }
        entry.write(name, tensor);
        any = true;
      } else {
        entry.write(name, value);
      }
    }
    if (count_may_be_missing && !item.value().toGenericDict().contains("step")) {
      entry.write("step", c10::IValue(int64_t{0}));
    }
    if (any) state_archive.write(key_of(item.key().toInt()), entry);
  }
  archive.write("state", state_archive);

  torch::serialize::OutputArchive groups_archive(unit);
  groups_archive.write("param_groups/size",
                       at::scalar_tensor(static_cast<int64_t>(groups.size()), at::kLong));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto group = groups.get(g).toGenericDict();  // checked above
    torch::serialize::OutputArchive group_archive(unit), options(unit);
    const auto params = group.at("params").toList();
    group_archive.write("params/size",
                        at::scalar_tensor(static_cast<int64_t>(params.size()), at::kLong));
    for (std::size_t j = 0; j < params.size(); ++j) {
      group_archive.write("params/" + std::to_string(j),
                          c10::IValue(key_of(params.get(j).toInt())));
    }
    for (const auto& option : group) {
      const std::string& name = option.key().toStringRef();
      if (name == "params" || option.value().isNone()) continue;
      const c10::IValue value = option_number(option.value(), name, g);
      if (value.isInt() && float_option(name)) {
        options.write(name, c10::IValue(static_cast<double>(value.toInt())));
      } else if (value.isList() || value.isTuple()) {
        // Python writes betas as a tuple (a list, from JSON-edited files, reads the same); an int
        // in it (betas=(0, 0.999)) is a double to LibTorch.
        std::vector<c10::IValue> items =
            value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
        for (auto& element : items) {
          element = option_number(element, name, g);
          if (element.isInt()) element = c10::IValue(static_cast<double>(element.toInt()));
        }
        options.write(name, c10::ivalue::Tuple::create(std::move(items)));
      } else {
        options.write(name, value);
      }
    }
    group_archive.write("options", options);
    groups_archive.write("param_groups/" + std::to_string(g), group_archive);
  }
  archive.write("param_groups", groups_archive);
  torch::serialize::InputArchive read = reread(archive);
  OptimizerSnapshot before(optimizer);
  try {
    optimizer.load(read);
  } catch (const c10::Error& error) {
    // What amp did not check above reaches the optimizer's own load, which may have replaced
    // some of the state already, and may say it in LibTorch's internal words.
    before.restore();
    TORCH_CHECK(false, "load_optimizer_state_dict: ", traits.name,
                " cannot take this state: ", error.what_without_backtrace(),
                " The optimizer is unchanged.");
  }
  warn_if_other_arithmetic(traits, groups);
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const std::string& path) {
  const c10::IValue state = load_pickled(path);
  try {
    load_optimizer_state_dict(optimizer, state);
  } catch (const c10::Error& error) {
    TORCH_CHECK(false, "'", path, "': ", error.msg());
  }
}

void save_optimizer_state_dict(const torch::optim::Optimizer& optimizer, const std::string& path) {
  save_pickled(optimizer_state_dict(optimizer), path);
}

}  // namespace amp
