// Python's state files in C++: what `torch.save(model.state_dict())`,
// `torch.save(optimizer.state_dict())` or a checkpoint dict of them writes, read and written by
// amp so that a run can move between Python and LibTorch (LibTorch's own unpickler refuses the
// first: pytorch/pytorch#100741).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <amp/export.h>

namespace amp {

/// Reads a file written by Python's `torch.save` (or by save_pickled) as values: dicts (string or
/// int keys, in the file's order; an OrderedDict too), lists, tuples, None, bools, ints, floats,
/// strings and CPU tensors (every dtype torch.save writes, float8 included; views of one storage
/// share it). The file is checked by check_archive first (<amp/archive.h>), then read by amp's
/// own evaluator, which accepts only those values.
/// Args: path: the file.
/// Returns: the value saved (for a state_dict, a GenericDict of string to tensor).
/// Errors: c10::Error naming the file and what is wrong (where, for a damaged file), or the
///   object it holds that is none of the above (a model pickled whole, a custom class).
AMP_EXPORT c10::IValue load_pickled(const std::string& path);

/// Writes `value` as Python's `torch.save` does, so that `torch.load(path, weights_only=True)`
/// reads it: GenericDicts (as dicts; string, int, float or bool keys), lists, tuples, None, bools,
/// ints, doubles, strings and tensors (any device: written from a contiguous CPU copy; each tensor
/// its own storage). The file is replaced whole: written beside it, then renamed.
/// Args: value: what to write; path: the file.
/// Errors: c10::Error naming the file and the value it cannot write (another IValue kind, or a
///   tensor dtype torch.save has no record for), or the file it cannot write.
AMP_EXPORT void save_pickled(const c10::IValue& value, const std::string& path);

/// A dict of names to values of any kind (LibTorch's Dict<str, Any>), the form of Python's
/// checkpoint dicts, for save_pickled. The AMP recipe's one-file checkpoint:
///   amp::save_pickled(amp::make_dict({{"model", amp::state_dict(*model)},
///                                     {"optimizer", amp::optimizer_state_dict(optimizer)},
///                                     {"scaler", scaler.state_dict()},
///                                     {"step", step}}),
///                     "checkpoint.pt");
/// which Python reads with `torch.load("checkpoint.pt", weights_only=True)`.
/// Errors: c10::Error naming a key given twice.
AMP_EXPORT c10::IValue make_dict(
    std::initializer_list<std::pair<std::string, c10::IValue>> entries = {});

/// The entry `name` of a dict load_pickled read (a checkpoint of Python's or make_dict's), as it
/// stands: pass it on to load_state_dict, load_optimizer_state_dict or
/// GradScaler::load_state_dict, or read a number with `.toInt()`.
/// Errors: c10::Error when `dict` is not a dict with string keys, or lacks `name` (listing the
///   names it has).
AMP_EXPORT c10::IValue dict_entry(const c10::IValue& dict, const std::string& name);

/// The keys a state dict and a module disagree on, as Python's `load_state_dict` returns them.
struct StateDictKeys {
  std::vector<std::string> missing_keys;     ///< the module's entries the state dict lacks
  std::vector<std::string> unexpected_keys;  ///< the state dict's entries the module lacks
};

/// A module's state as Python's `model.state_dict()` names it: every parameter and buffer by its
/// fully qualified name ("0.weight", "encoder.norm.running_mean"), parameters of each module
/// before its buffers, then its children in order, detached. An amp::CheckpointWrapper adds no
/// level ("0.weight", not "0.module.weight"), as its archives and Python's checkpoint_wrapper. An
/// IValue as it stands: put it in a checkpoint dict for save_pickled, or pass it to
/// load_state_dict.
AMP_EXPORT c10::Dict<std::string, at::Tensor> state_dict(const torch::nn::Module& module);

/// Loads `state` (a dict of string to tensor: what load_pickled reads from
/// `torch.save(model.state_dict(), path)`) into `module`'s parameters and buffers by name, as
/// Python's `model.load_state_dict(state, strict)` does, on the module's devices.
/// All-or-nothing: every entry is checked before any is copied.
/// Args: module: the module; state: the state dict; strict: refuse missing or unexpected keys.
/// Returns: the missing and unexpected keys (empty when strict).
/// Errors: c10::Error, the module unchanged: `state` is not a dict of string to tensor; with
///   strict, a sentence listing the missing and unexpected keys; whatever `strict`, an entry
///   whose shape or dtype differs from the module's (naming the key, both shapes and dtypes;
///   Python converts dtypes, amp refuses: a bf16 file loaded into an fp32 model is a mistake).
AMP_EXPORT StateDictKeys load_state_dict(torch::nn::Module& module, const c10::IValue& state,
                                         bool strict = true);

/// Python's `torch.nn.modules.utils.consume_prefix_in_state_dict_if_present`: removes `prefix`
/// from every key of `state` that starts with it, in place, keeping the order. What Python's
/// DistributedDataParallel (or torch.compile) saves names every entry under "module." (or
/// "_orig_mod."): strip it before load_state_dict into the plain module, as amp's
/// DistributedDataParallel wraps no names (`amp::state_dict(*ddp.module())`).
/// Errors: c10::Error when `state` is not a dict with string keys (naming what it is).
AMP_EXPORT void consume_prefix_in_state_dict_if_present(c10::IValue& state,
                                                        const std::string& prefix);

/// load_pickled(path), then load_state_dict(module, value, strict); errors name the file. The
/// file's `_metadata` (the module versions torch.save writes with a state_dict) is read as
/// Python's modules read it: a BatchNorm or InstanceNorm saved before version 2 (or with no
/// version: a plain dict, a converted file) may lack num_batches_tracked, which the module then
/// keeps; an InstanceNorm without running statistics refuses a version-less state that has them,
/// in Python's words. An IValue carries no `_metadata`: the overload above reads every module as
/// version-less, as Python reads a plain dict.
AMP_EXPORT StateDictKeys load_state_dict(torch::nn::Module& module, const std::string& path,
                                         bool strict = true);

/// Writes state_dict(module) as an OrderedDict, as `torch.save(model.state_dict(), path)` does:
/// Python reads it with `torch.load(path, weights_only=True)` and `model.load_state_dict`.
/// Errors: as save_pickled.
AMP_EXPORT void save_state_dict(const torch::nn::Module& module, const std::string& path);

/// `optimizer`'s state in the layout of Python's `optimizer.state_dict()`: {"state": {index:
/// {name: tensor}}, "param_groups": [{option: value, ..., "params": [index, ...]}]}, parameters
/// numbered across groups in order, "step" a float32 0-dim tensor as Python keeps it; each group
/// also says which implementation Python must run to continue with the same arithmetic (amp's
/// FusedAdam/AdamW/SGD: "fused": true; LibTorch's Adam/AdamW/SGD: "foreach" and "fused" false).
/// For any
/// LibTorch optimizer that saves in LibTorch's optimizer layout: LibTorch's Adam, AdamW and SGD,
/// and amp's FusedAdam, FusedAdamW, FusedSGD and FusedLion, whose extra options
/// (`master_weights`, `rounding_seed`, ...) and state (`master_weight`, `kahan_comp`) travel
/// under their own names, which Python keeps and ignores. Python's `load_state_dict` casts every
/// state tensor but `step` to its parameter's dtype: a float32 master copy (or float32 moments)
/// of a bf16 parameter comes back from a Python optimizer rounded to bf16 (amp takes it back as
/// float32, rounded); Kahan compensation, in the parameter's dtype, comes back as it went, and a
/// file only read and written again by Python keeps everything.
/// Errors: c10::Error when the optimizer's own save fails.
AMP_EXPORT c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer);

/// Loads `state` (what `torch.save(optimizer.state_dict())` writes, read by load_pickled, or
/// optimizer_state_dict's value) into `optimizer` through the optimizer's own load: each saved
/// group's options and each parameter's state by position, as Python matches them. Python's
/// `None` entries (an SGD step without momentum, `foreach`) are left out; int options become
/// floats where LibTorch reads a double (`lr`, `eps`, `weight_decay`, `momentum`, `dampening`:
/// Python's `weight_decay=0`).
/// Errors: c10::Error, and the optimizer unchanged: `state` is not such a dict (naming what is
///   wrong); another group count or group size, or a parameter index listed twice (naming the
///   group; checked before the optimizer's own load, as LibTorch's load would replace earlier
///   groups before it checks a later one); a group whose `decoupled_weight_decay` (with a nonzero
///   weight decay) or `maximize=True` the optimizer does not compute; a `step` that is not a whole
///   number from 0 to 2^53; or a state the optimizer's load refuses.
AMP_EXPORT void load_optimizer_state_dict(torch::optim::Optimizer& optimizer,
                                          const c10::IValue& state);

/// load_pickled(path), then load_optimizer_state_dict; errors name the file.
AMP_EXPORT void load_optimizer_state_dict(torch::optim::Optimizer& optimizer,
                                          const std::string& path);

/// save_pickled(optimizer_state_dict(optimizer), path): Python's `optimizer.load_state_dict(
/// torch.load(path, weights_only=True))` reads it.
AMP_EXPORT void save_optimizer_state_dict(const torch::optim::Optimizer& optimizer,
                                          const std::string& path);

}  // namespace amp
