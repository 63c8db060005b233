// The values of a torch.save pickle (Python's or amp's): dicts, lists, tuples, numbers, strings
// and tensor records, evaluated after the archive checker has accepted the pickle. Python's
// `torch.save(model.state_dict())`, `torch.save(optimizer.state_dict())` and a checkpoint dict of
// them are such pickles; LibTorch's own unpickler refuses the first (pytorch/pytorch#100741).
// Standard C++ only (no torch): the fuzzer builds it without LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serialize/reader_error.h"

namespace amp::detail {

/// A tensor as the pickle describes it: where its bytes are and how to view them.
struct PickledTensor {
  std::string key;    ///< its storage's data entry, "data/<key>"
  std::string dtype;  ///< as torch names it: "float32", "bfloat16", "float8_e4m3fn", ...
  std::uint64_t element_size = 0;
  std::string location;             ///< the device it was saved from: "cpu", "cuda:0"
  std::uint64_t storage_numel = 0;  ///< elements of `dtype` in the storage
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes, strides;
  bool requires_grad = false;
};

/// One value of the pickle. Containers share their items with every copy (the memo's and the
/// stack's), as Python's objects do.
struct PickledValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kTensor };
  Kind kind = Kind::kNone;
  std::int64_t integer = 0;  ///< kInt; kBool as 0 or 1
  double real = 0.0;         ///< kFloat
  std::string text;          ///< kString
  /// kTuple, kList: the items; kDict: keys and values alternating, in insertion order.
  std::shared_ptr<std::vector<PickledValue>> items;
  bool ordered_dict = false;  ///< kDict made by collections.OrderedDict (a module's state_dict)
  /// An OrderedDict's attributes, shared by every copy: what BUILD gave it (a module state_dict's
  /// {"_metadata": {module prefix: {"version": n}}}), or None.
  std::shared_ptr<PickledValue> attributes;
  std::shared_ptr<const PickledTensor> tensor;  ///< kTensor
};

/// A value that holds no container: None, a bool or an int (`integer`), a float (`real`) or a
/// string (`text`).
PickledValue pickled_scalar(PickledValue::Kind kind, std::int64_t integer = 0, double real = 0.0,
                            std::string text = {});

/// A dtype torch.save writes, with the GLOBAL that names it in a tensor record: a typed storage
/// (`torch.FloatStorage`, read with _rebuild_tensor_v2) or, for the dtypes that have none, the
/// dtype itself (`torch.float8_e4m3fn`, with an UntypedStorage and _rebuild_tensor_v3).
struct SavedDtype {
  const char* name;    ///< torch's name: "float32", "float8_e4m3fn"
  const char* global;  ///< after "torch." in the pickle: "FloatStorage", "float8_e4m3fn"
  bool typed_storage;  ///< `global` is a storage type (v2) rather than a dtype (v3)
  std::uint64_t element_size;
};

/// The SavedDtype named `name` (torch's name), or null when torch.save has no record for it.
const SavedDtype* saved_dtype(std::string_view name);

/// What each kind is called in messages ("a dict", "a tensor").
const char* describe_kind(PickledValue::Kind kind);

/// Evaluates `pickle` (`entry_name` is used in messages), which check_archive_pickle accepted:
/// the value it builds. Accepts torch.save's subset of what the checker does (no __torch__
/// classes; an nn.Parameter, from _rebuild_parameter, is its tensor with requires_grad), refuses
/// the rest with ReaderError naming the byte; an OrderedDict's attributes (BUILD: a module
/// state_dict's `_metadata`) are kept in `attributes`. A value that holds itself (Python's
/// `l.append(l)`) is refused: no C++ value can. Time and memory are proportional to the
/// pickle's size.
PickledValue evaluate_torch_pickle(std::string_view pickle, std::string_view entry_name);

}  // namespace amp::detail
