// amp::load_archive and amp::load: reading torch::serialize archives (checkpoints) that were
// checked before LibTorch's reader parses them.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/tensor.h>

#include <amp/export.h>

namespace amp {

/// Checks the archive file at `path` (what `torch::save`, `OutputArchive::save_to` and amp's
/// examples write) without LibTorch, so that a damaged or hostile file is refused with a sentence
/// instead of crashing, hanging or exhausting memory inside LibTorch's reader. Checks the zip
/// directory against the file's real size, every pickle with a scanner that allows only what
/// LibTorch's pickler writes (opcodes, imports, nesting at most 100 deep, memo indices in order,
/// tensor records inside their data entries), and the TorchScript class definitions line by line
/// (attribute types only, brackets at most 16 deep). Reads the file through a memory map: time
/// and memory grow with the pickles and code, not with the tensor bytes.
/// Args: path: the archive file.
/// Errors: c10::Error naming the file and saying what is wrong and where (entry, byte or line):
///   no such file, not a regular file, or a check failed. Archives of 4 GiB or more are read
///   through their ZIP64 records, which must agree with the ordinary ones where both give a value.
AMP_EXPORT void check_archive(const std::string& path);

/// check_archive, then `torch::serialize::InputArchive::load_from(path, device)`.
/// Args: path: the archive file; device: where tensors go (as load_from; none: where saved).
/// Returns: the loaded archive.
/// Errors: c10::Error naming the file: refused by check_archive, or any exception LibTorch's
///   reader raised (its message is kept).
AMP_EXPORT torch::serialize::InputArchive load_archive(
    const std::string& path, std::optional<c10::Device> device = std::nullopt);

namespace detail {
/// Rethrows `error` (the one being handled) as a c10::Error that names `path`; used by load().
[[noreturn]] AMP_EXPORT void rethrow_naming_file(const std::string& path,
                                                 const std::exception& error);
}  // namespace detail

/// `torch::load(value, path)` with the checks of load_archive: reads the archive at `path` and
/// then `value` from it with `archive >> value` (a module, an optimizer, a GradScaler, a tensor).
/// Args: value: what to fill; path: the archive file; device: as load_archive.
/// Errors: c10::Error naming the file, from load_archive or from reading `value` (a
///   GradScaler's load refuses bad values and leaves the scaler unchanged).
template <typename Value>
void load(Value& value, const std::string& path, std::optional<c10::Device> device = std::nullopt) {
  torch::serialize::InputArchive archive = load_archive(path, device);
  try {
    archive >> value;
  } catch (const std::exception& error) {
    detail::rethrow_naming_file(path, error);
  }
}

/// The form for what `torch::save(std::vector<at::Tensor>, path)` writes, as `torch::load`'s:
/// appends the tensors saved under "0", "1", ... to `tensors`.
/// Errors: as load_archive.
inline void load(std::vector<at::Tensor>& tensors, const std::string& path,
                 std::optional<c10::Device> device = std::nullopt) {
  torch::serialize::InputArchive archive = load_archive(path, device);
  try {
    at::Tensor tensor;
    for (std::size_t index = 0; archive.try_read(std::to_string(index), tensor); ++index) {
      tensors.push_back(std::move(tensor));
      tensor = at::Tensor();
    }
  } catch (const std::exception& error) {
    detail::rethrow_naming_file(path, error);
  }
}

}  // namespace amp
