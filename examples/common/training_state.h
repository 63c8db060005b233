// The training examples' saved training state (--checkpoint/--resume files): saved so that an
// interrupted save keeps the previous file, and read back only into the program, format and
// settings that wrote them.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"

namespace amp_examples {

/// A setting a checkpoint must share with the run that resumes it, because it changes what the
/// remaining steps compute: the option's name (as the messages show it) and its value.
struct CheckpointSetting {
  std::string name;
  c10::IValue value;
  /// For a setting added after checkpoints of this format were first written: the value that
  /// every checkpoint without the entry was written with (e.g. the one optimizer that existed),
  /// so those checkpoints still resume. None: a checkpoint must have the entry.
  c10::IValue if_absent = c10::IValue();
};

/// Writes a file so that it is either the old one or the whole new one: `write` fills
/// `<path>.partial`, which is then renamed over `path` (a rename within one folder replaces the
/// target in one step).
/// Args: path: the file to replace or create; write: writes the complete contents to the path
///   it is given.
/// Errors: whatever `write` throws, or std::filesystem::filesystem_error from the rename. On an
///   error `path` is left as it was and `<path>.partial` is removed.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(const std::filesystem::path&)>& write);

/// Saves `archive` to `path` with write_file_atomically.
void save_checkpoint(torch::serialize::OutputArchive& archive, const std::filesystem::path& path);

/// Writes a sub-archive filled by `fill` under `key`, e.g. a module's or an optimizer's state.
void write_section(torch::serialize::OutputArchive& archive, const std::string& key,
                   const std::function<void(torch::serialize::OutputArchive&)>& fill);

/// Writes a CPU generator's state (a uint8 tensor) under `key`, so that a resumed run draws the
/// same numbers.
void write_generator(torch::serialize::OutputArchive& archive, const std::string& key,
                     at::Generator& generator);

/// Writes each setting as an entry named after it.
void write_settings(torch::serialize::OutputArchive& archive,
                    const std::vector<CheckpointSetting>& settings);

/// --checkpoint PATH and --resume: where a run saves its state after every epoch, and whether it
/// starts from the state saved there.
struct CheckpointOptions {
  /// Empty for no checkpoint.
  std::filesystem::path path;
  bool resume = false;

  /// Registers --checkpoint PATH and --resume with the program's help lines.
  void add_to(CommandLine& cli, std::string checkpoint_help, std::string resume_help);

  /// Errors: UsageError when --resume is given without --checkpoint.
  void check() const;

  /// Errors: SetupError when resuming and there is no file at `path` (before any data is loaded).
  void require_file() const;

  /// Prints "resumed from PATH after epoch N" when resuming (N: `epochs_done`), then
  /// "checkpoint: saved to PATH after every epoch" when saving.
  void announce(std::int64_t epochs_done) const;
};

/// Refuses a checkpoint whose "format" entry is not `format`, then one written with a setting
/// other than this run's, naming the setting and both values. A setting the checkpoint lacks is
/// compared through its `if_absent` value, or refused when it has none. `lookup` returns an
/// entry of the file, nullopt when it has none; `path` and `program` are named in the errors.
/// Errors: SetupError.
void check_checkpoint_settings(
    const std::filesystem::path& path, const std::string& program, std::int64_t format,
    const std::vector<CheckpointSetting>& settings,
    const std::function<std::optional<c10::IValue>(const std::string&)>& lookup);

/// A checkpoint opened for resuming. Every problem is a SetupError that names the file.
class CheckpointReader {
 public:
  /// Opens the checkpoint at `path`, moving its tensors onto `device`.
  /// Args: program: the program that writes such files, named when an entry is missing.
  /// Errors: SetupError when the file cannot be read as a checkpoint (damaged, truncated, or not a
  ///   checkpoint at all).
  CheckpointReader(std::filesystem::path path, c10::Device device, std::string program);

  /// Refuses a checkpoint whose "format" entry is not `format`, then one written with a setting
  /// other than this run's, naming the setting and both values. A setting the checkpoint lacks
  /// is compared through its `if_absent` value, or refused when it has none.
  void check(std::int64_t format, const std::vector<CheckpointSetting>& settings);

  /// The entry `key`. Errors: SetupError when there is none.
  c10::IValue entry(const std::string& key);

  /// Reads the sub-archive `key` (written by write_section) and passes it to `load`. Any error
  /// reading it or inside `load` (c10::Error, std::exception) becomes a SetupError naming the
  /// entry and the file.
  void read_section(const std::string& key,
                    const std::function<void(torch::serialize::InputArchive&)>& load);

  /// Restores `generator`'s state from `key` (written by write_generator).
  void read_generator(const std::string& key, at::Generator& generator);

 private:
  // Runs `read`, turning any error but a SetupError into one naming `key` and the file.
  void guarded(const std::string& key, const std::function<void()>& read);

  std::filesystem::path path_;
  std::string program_;
  torch::serialize::InputArchive archive_;
};

}  // namespace amp_examples
