// The examples' checkpoint files: atomic saves, sections, generator state, and checked reads.
#include "training_state.h"

#include <amp/archive.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <mutex>
#include <system_error>

#include "program.h"

namespace amp_examples {

void CheckpointOptions::add_to(CommandLine& cli, std::string checkpoint_help,
                               std::string resume_help) {
  cli.add_option("checkpoint", "PATH", std::move(checkpoint_help),
                 [this](std::string_view value) { path = value; });
  cli.add_flag("resume", std::move(resume_help), [this] { resume = true; });
}

void CheckpointOptions::check() const {
  if (resume && path.empty()) {
    throw UsageError("--resume continues from a checkpoint; name it with --checkpoint PATH");
  }
}

void CheckpointOptions::require_file() const {
  if (resume && !std::filesystem::exists(path)) {
    throw SetupError(fmt::format(
        "--resume: there is no checkpoint at '{}'; run once without --resume to create it",
        path.string()));
  }
}

void CheckpointOptions::announce(std::int64_t epochs_done) const {
  if (resume) fmt::print("resumed from {} after epoch {}\n", path.string(), epochs_done);
  if (!path.empty()) fmt::print("checkpoint: saved to {} after every epoch\n", path.string());
}

void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(const std::filesystem::path&)>& write) {
  std::filesystem::path partial = path;
  partial += ".partial";
  try {
    write(partial);
    std::filesystem::rename(partial, path);
  } catch (...) {
    // What was written is incomplete; the file it was to replace is untouched.
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
}

void save_checkpoint(torch::serialize::OutputArchive& archive, const std::filesystem::path& path) {
  write_file_atomically(
      path, [&](const std::filesystem::path& partial) { archive.save_to(partial.string()); });
}

void write_section(torch::serialize::OutputArchive& archive, const std::string& key,
                   const std::function<void(torch::serialize::OutputArchive&)>& fill) {
  torch::serialize::OutputArchive section;
  fill(section);
  archive.write(key, section);
}

void write_generator(torch::serialize::OutputArchive& archive, const std::string& key,
                     at::Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  archive.write(key, generator.get_state(), /*is_buffer=*/true);
}

void write_settings(torch::serialize::OutputArchive& archive,
                    const std::vector<CheckpointSetting>& settings) {
  for (const CheckpointSetting& setting : settings) archive.write(setting.name, setting.value);
}

CheckpointReader::CheckpointReader(std::filesystem::path path, c10::Device device,
                                   std::string program)
    : path_(std::move(path)), program_(std::move(program)) {
  // amp::load_archive checks the file before LibTorch's reader parses it (a damaged checkpoint
  // is refused instead of crashing the program) and reports what LibTorch then refuses with a
  // c10::Error; anything else (std::bad_alloc) means the same to the user.
  try {
    archive_ = amp::load_archive(path_.string(), device);
  } catch (const std::exception& error) {
    throw SetupError(
        fmt::format("cannot read the checkpoint '{}' (damaged, truncated or not a "
                    "checkpoint): {}",
                    path_.string(), message_of(error)));
  }
}

void check_checkpoint_settings(
    const std::filesystem::path& path, const std::string& program, std::int64_t format,
    const std::vector<CheckpointSetting>& settings,
    const std::function<std::optional<c10::IValue>(const std::string&)>& lookup) {
  const auto entry = [&](const std::string& key) {
    std::optional<c10::IValue> value = lookup(key);
    if (!value) {
      throw SetupError(fmt::format(
          "the checkpoint '{}' has no entry '{}'; it was not written by {} --checkpoint",
          path.string(), key, program));
    }
    return *value;
  };
  const c10::IValue saved_format = entry("format");
  if (!saved_format.isInt() || saved_format.toInt() != format) {
    throw SetupError(fmt::format("the checkpoint '{}' has format {}; this {} reads format {} only",
                                 path.string(), c10::str(saved_format), program, format));
  }
  for (const CheckpointSetting& setting : settings) {
    // Without a value to assume, entry() refuses the checkpoint, naming the missing entry.
    const std::optional<c10::IValue> found = lookup(setting.name);
    const c10::IValue saved =
        found ? *found : (setting.if_absent.isNone() ? entry(setting.name) : setting.if_absent);
    if (saved != setting.value) {
      throw SetupError(fmt::format(
          "the checkpoint '{}' was written with {} {} but this run has {} {}; resume with the "
          "checkpoint's settings, or start afresh without --resume",
          path.string(), setting.name, c10::str(saved), setting.name, c10::str(setting.value)));
    }
  }
}

void CheckpointReader::check(std::int64_t format, const std::vector<CheckpointSetting>& settings) {
  check_checkpoint_settings(path_, program_, format, settings,
                            [this](const std::string& key) -> std::optional<c10::IValue> {
                              c10::IValue value;
                              if (!archive_.try_read(key, value)) return std::nullopt;
                              return value;
                            });
}

c10::IValue CheckpointReader::entry(const std::string& key) {
  c10::IValue value;
  if (!archive_.try_read(key, value)) {
    throw SetupError(
        fmt::format("the checkpoint '{}' has no entry '{}'; it was not written by {} --checkpoint",
                    path_.string(), key, program_));
  }
  return value;
}

void CheckpointReader::read_section(
    const std::string& key, const std::function<void(torch::serialize::InputArchive&)>& load) {
  guarded(key, [&] {
    torch::serialize::InputArchive section;
    archive_.read(key, section);
    load(section);
  });
}

void CheckpointReader::read_generator(const std::string& key, at::Generator& generator) {
  guarded(key, [&] {
    torch::Tensor state;
    archive_.read(key, state, /*is_buffer=*/true);
    std::lock_guard<std::mutex> lock(generator.mutex());
    // load_from moved every tensor to the run's device; a CPU generator's state lives on the CPU.
    generator.set_state(state.to(torch::kCPU));
  });
}

void CheckpointReader::guarded(const std::string& key, const std::function<void()>& read) {
  try {
    read();
  } catch (const SetupError&) {
    throw;
  } catch (const std::exception& error) {
    throw SetupError(fmt::format(
        "cannot read '{}' from the checkpoint '{}' (damaged, or not written by {} --checkpoint): "
        "{}",
        key, path_.string(), program_, message_of(error)));
  }
}

}  // namespace amp_examples
