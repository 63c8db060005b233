// The examples' checkpoint files: an interrupted save keeps the old file, what is saved reads
// back, and each unusable checkpoint is refused with a message naming the file and the problem.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/program.h"
#include "common/training_state.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using amp_examples::CheckpointReader;
using amp_examples::CheckpointSetting;
using amp_examples::SetupError;
using amp_examples::UsageError;
using amp_test::TempDir;
using Catch::Matchers::Message;
using Catch::Matchers::StartsWith;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const std::vector<CheckpointSetting> kSettings = {
    {"precision", std::string("fp16")}, {"batch-size", std::int64_t{64}}, {"lr", 0.01}};

// A checkpoint as the examples write one: a section, the format, an epoch, a generator, settings.
void save_example(const fs::path& path, std::int64_t format, at::Generator& generator) {
  torch::serialize::OutputArchive archive;
  amp_examples::write_section(archive, "model", [](torch::serialize::OutputArchive& section) {
    section.write("weight", torch::tensor({1.5F, -2.0F}));
  });
  archive.write("format", c10::IValue(format));
  archive.write("epoch", c10::IValue(std::int64_t{3}));
  amp_examples::write_generator(archive, "shuffle", generator);
  amp_examples::write_settings(archive, kSettings);
  amp_examples::save_checkpoint(archive, path);
}

/// A checkpoint saved by save_example (format 1) in a fresh folder: what most cases start from.
struct SavedCheckpoint {
  TempDir dir{"checkpoint_tests"};
  fs::path path = dir.path() / "run.pt";
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  SavedCheckpoint() { save_example(path, 1, generator); }
};

}  // namespace

TEST_CASE("An atomic write creates or replaces the file and leaves no partial file", "[examples]") {
  TempDir dir("checkpoint_tests");
  const fs::path path = dir.path() / "state.pt";
  const auto write = [](const std::string& text) {
    return [text](const fs::path& partial) {
      // The contents go to a file beside the target, never to the target itself.
      CHECK(partial == partial.parent_path() / "state.pt.partial");
      write_text(partial, text);
    };
  };
  amp_examples::write_file_atomically(path, write("first"));
  CHECK(read_text(path) == "first");
  amp_examples::write_file_atomically(path, write("second"));
  CHECK(read_text(path) == "second");
  CHECK_FALSE(fs::exists(dir.path() / "state.pt.partial"));
}

TEST_CASE("A write that fails half way leaves the old file as it was and removes the partial one",
          "[examples]") {
  TempDir dir("checkpoint_tests");
  const fs::path path = dir.path() / "state.pt";
  write_text(path, "the previous epoch");
  CHECK_THROWS_WITH(amp_examples::write_file_atomically(path,
                                                        [](const fs::path& partial) {
                                                          write_text(partial, "half of a new");
                                                          throw std::runtime_error("disk full");
                                                        }),
                    "disk full");
  CHECK(read_text(path) == "the previous epoch");
  CHECK_FALSE(fs::exists(dir.path() / "state.pt.partial"));
}

TEST_CASE_METHOD(SavedCheckpoint,
                 "A checkpoint that LibTorch cannot write leaves the previous checkpoint intact",
                 "[examples]") {
  const std::string previous = read_text(path);
  // A folder (not empty, so it stays) where the partial file would go makes the save fail.
  fs::create_directories(dir.path() / "run.pt.partial" / "occupied");
  CHECK_THROWS_AS(save_example(path, 2, generator), c10::Error);
  CHECK(read_text(path) == previous);
  CheckpointReader reader(path, torch::kCPU, "prog");
  CHECK_NOTHROW(reader.check(1, kSettings));
}

TEST_CASE("A saved checkpoint reads back: entries, sections and the generator's state",
          "[examples]") {
  TempDir dir("checkpoint_tests");
  const fs::path path = dir.path() / "run.pt";
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(42);
  (void)torch::randperm(10, generator);  // moves the generator off its seed
  save_example(path, 1, generator);
  // What the generator draws after the save is what a restored one must draw.
  const torch::Tensor expected = torch::randperm(100, generator);

  CheckpointReader reader(path, torch::kCPU, "prog");
  CHECK_NOTHROW(reader.check(1, kSettings));
  CHECK(reader.entry("epoch").toInt() == 3);
  reader.read_section("model", [](torch::serialize::InputArchive& section) {
    torch::Tensor weight;
    section.read("weight", weight);
    CHECK(torch::equal(weight, torch::tensor({1.5F, -2.0F})));
  });
  at::Generator restored = at::make_generator<at::CPUGeneratorImpl>(0);
  reader.read_generator("shuffle", restored);
  CHECK(torch::equal(torch::randperm(100, restored), expected));
}

TEST_CASE_METHOD(SavedCheckpoint,
                 "A checkpoint of another format or other settings is refused, naming what differs",
                 "[examples]") {
  CheckpointReader reader(path, torch::kCPU, "prog");
  CHECK_THROWS_MATCHES(reader.check(2, kSettings), SetupError,
                       Message("the checkpoint '" + path.string() +
                               "' has format 1; this prog reads format 2 only"));

  std::vector<CheckpointSetting> other = kSettings;
  other[1].value = std::int64_t{7};
  CHECK_THROWS_MATCHES(
      reader.check(1, other), SetupError,
      Message("the checkpoint '" + path.string() +
              "' was written with batch-size 64 but this run has batch-size 7; resume with the "
              "checkpoint's settings, or start afresh without --resume"));
  other = kSettings;
  other[0].value = std::string("bf16");
  CHECK_THROWS_WITH(reader.check(1, other),
                    Catch::Contains("was written with precision fp16 but this run has precision "
                                    "bf16; resume with"));

  other = kSettings;
  other.push_back({"seed", std::int64_t{0}});
  CHECK_THROWS_MATCHES(reader.check(1, other), SetupError,
                       Message("the checkpoint '" + path.string() +
                               "' has no entry 'seed'; it was not written by prog --checkpoint"));
}

TEST_CASE_METHOD(SavedCheckpoint,
                 "A setting added later is compared through the value older checkpoints were "
                 "written with",
                 "[examples]") {
  // save_example wrote no "--optimizer" entry.
  CheckpointReader reader(path, torch::kCPU, "prog");

  std::vector<CheckpointSetting> settings = kSettings;
  settings.push_back({"--optimizer", std::string("sgd"), std::string("sgd")});
  CHECK_NOTHROW(reader.check(1, settings));
  settings.back().value = std::string("fused-sgd");
  CHECK_THROWS_MATCHES(
      reader.check(1, settings), SetupError,
      Message("the checkpoint '" + path.string() +
              "' was written with --optimizer sgd but this run has --optimizer fused-sgd; resume "
              "with the checkpoint's settings, or start afresh without --resume"));

  // An entry the checkpoint has wins over the assumed value.
  CHECK_NOTHROW(reader.check(1, {{"lr", 0.01, 0.5}}));
  CHECK_THROWS_WITH(reader.check(1, {{"lr", 0.5, 0.5}}),
                    Catch::Contains("was written with lr 0.01 but this run has lr 0.5"));
}

TEST_CASE("A file that is not a checkpoint is refused when it is opened", "[examples]") {
  TempDir dir("checkpoint_tests");
  const fs::path path = dir.path() / "notes.txt";
  write_text(path, "not a checkpoint");
  CHECK_THROWS_AS(CheckpointReader(path, torch::kCPU, "prog"), SetupError);
  CHECK_THROWS_WITH(CheckpointReader(path, torch::kCPU, "prog"),
                    StartsWith("cannot read the checkpoint '" + path.string() +
                               "' (damaged, truncated or not a checkpoint): "));

  // A damaged checkpoint is refused by amp's check before LibTorch's reader parses it (a
  // storage type LibTorch does not know crashed its reader).
  const fs::path damaged = dir.path() / "run.pt";
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
  save_example(damaged, 1, generator);
  std::string bytes = read_text(damaged);
  const auto at = bytes.find("FloatStorage");
  REQUIRE(at != std::string::npos);
  bytes.replace(at, 12, "FlootStorage");
  write_text(damaged, bytes);
  CHECK_THROWS_WITH(
      CheckpointReader(damaged, torch::kCPU, "prog"),
      StartsWith("cannot read the checkpoint '" + damaged.string() +
                 "' (damaged, truncated or not a checkpoint): amp::check_archive: '") &&
          Catch::Matchers::Contains("its bytes are damaged"));
}

TEST_CASE_METHOD(SavedCheckpoint,
                 "A section that cannot be loaded is a SetupError naming the entry and the file",
                 "[examples]") {
  CheckpointReader reader(path, torch::kCPU, "prog");
  const std::string expected = "cannot read 'model' from the checkpoint '" + path.string() +
                               "' (damaged, or not written by prog --checkpoint): ";
  // A LibTorch error inside the load (here: a missing tensor), without its C++ backtrace.
  CHECK_THROWS_WITH(reader.read_section("model",
                                        [](torch::serialize::InputArchive& section) {
                                          torch::Tensor bias;
                                          section.read("bias", bias);
                                        }),
                    StartsWith(expected) && !Catch::Matchers::Contains("frame #"));
  // Exceptions that are not c10::Error (LibTorch's reader also throws std::out_of_range and
  // std::bad_alloc on damaged files) are reported the same way.
  CHECK_THROWS_WITH(
      reader.read_section("model",
                          [](torch::serialize::InputArchive&) { throw std::out_of_range("idx"); }),
      Catch::Matchers::Equals(expected + "idx"));
  CHECK_THROWS_WITH(
      reader.read_section("model", [](torch::serialize::InputArchive&) { throw std::bad_alloc(); }),
      Catch::Matchers::Equals(expected + "out of memory (std::bad_alloc)"));
  // A SetupError from the load passes through unchanged.
  CHECK_THROWS_WITH(reader.read_section("model",
                                        [](torch::serialize::InputArchive&) {
                                          throw SetupError("the model has other layers");
                                        }),
                    Catch::Matchers::Equals("the model has other layers"));
  // A generator entry that is missing is reported through the same path.
  CHECK_THROWS_WITH(reader.read_generator("no-such-generator", generator),
                    StartsWith("cannot read 'no-such-generator' from the checkpoint '"));
}

TEST_CASE("The --checkpoint and --resume options: registered, checked together, the file required",
          "[examples]") {
  TempDir dir("checkpoint_tests");
  amp_examples::CheckpointOptions options;
  amp_examples::CommandLine cli("prog", "Trains.");
  options.add_to(cli, "save after every epoch", "continue the saved run");
  CHECK_THAT(cli.usage(), Catch::Contains("--checkpoint PATH  save after every epoch"));
  CHECK_THAT(cli.usage(), Catch::Contains("--resume           continue the saved run"));

  std::vector<const char*> args = {"prog", "--resume"};
  CHECK(cli.parse(static_cast<int>(args.size()), args.data()));
  CHECK(options.resume);
  CHECK_THROWS_MATCHES(
      options.check(), UsageError,
      Message("--resume continues from a checkpoint; name it with --checkpoint PATH"));

  const fs::path path = dir.path() / "none.pt";
  const std::string path_text = path.string();
  args = {"prog", "--checkpoint", path_text.c_str()};
  CHECK(cli.parse(static_cast<int>(args.size()), args.data()));
  CHECK(options.path == path);
  CHECK_NOTHROW(options.check());
  CHECK_THROWS_MATCHES(options.require_file(), SetupError,
                       Message("--resume: there is no checkpoint at '" + path.string() +
                               "'; run once without --resume to create it"));
  write_text(path, "");
  CHECK_NOTHROW(options.require_file());
  // Without --resume, a missing file is only where the first checkpoint will go.
  options.resume = false;
  fs::remove(path);
  CHECK_NOTHROW(options.require_file());
}
