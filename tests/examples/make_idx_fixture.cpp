// Writes small MNIST-format IDX datasets for the example's tests: one good (learnable) set and
// broken copies, one defect each. Usage: make_idx_fixture OUT_DIR
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <vector>

#include "idx_writer.h"

namespace {

namespace fs = std::filesystem;
using amp_test::Bytes;
using amp_test::encode_idx;
using amp_test::kIdxImagesMagic;
using amp_test::kIdxLabelsMagic;
using amp_test::write_gzip;
using amp_test::write_raw;

constexpr std::uint32_t kSide = 28;
constexpr std::uint32_t kClasses = 10;
constexpr std::uint32_t kTrainCount = 256;
constexpr std::uint32_t kTestCount = 64;

struct Split {
  Bytes images;  // count * 28 * 28
  Bytes labels;  // count
};

// Each class lights a band of two rows of its own on a dim noisy background, so a linear model
// separates the classes after a few SGD steps while the images still vary.
Split make_split(std::uint32_t count, std::mt19937& rng) {
  Split split;
  split.images.resize(std::size_t{count} * kSide * kSide);
  split.labels.resize(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint32_t label = (i * 7 + rng() % 3) % kClasses;
    split.labels[i] = static_cast<std::uint8_t>(label);
    std::uint8_t* image = split.images.data() + std::size_t{i} * kSide * kSide;
    for (std::uint32_t row = 0; row < kSide; ++row) {
      const bool band = row == 4 + 2 * label || row == 5 + 2 * label;
      for (std::uint32_t col = 0; col < kSide; ++col) {
        image[row * kSide + col] = static_cast<std::uint8_t>(band ? 180 + rng() % 76 : rng() % 60);
      }
    }
  }
  return split;
}

struct Files {
  Bytes train_images, train_labels, test_images, test_labels;
};

Files encode(const Split& train, const Split& test) {
  const auto images = [](const Split& split) {
    const auto count = static_cast<std::uint32_t>(split.labels.size());
    return encode_idx(kIdxImagesMagic, {count, kSide, kSide}, split.images);
  };
  const auto labels = [](const Split& split) {
    return encode_idx(kIdxLabelsMagic, {static_cast<std::uint32_t>(split.labels.size())},
                      split.labels);
  };
  return {images(train), labels(train), images(test), labels(test)};
}

// Half the files gzipped and half raw, so one run exercises both paths of the reader.
void write_set(const fs::path& dir, const Files& files) {
  fs::create_directories(dir);
  write_gzip(dir / "train-images-idx3-ubyte.gz", files.train_images);
  write_raw(dir / "train-labels-idx1-ubyte", files.train_labels);
  write_raw(dir / "t10k-images-idx3-ubyte", files.test_images);
  write_gzip(dir / "t10k-labels-idx1-ubyte.gz", files.test_labels);
}

void cut_file(const fs::path& path, std::uintmax_t keep_bytes) {
  fs::resize_file(path, keep_bytes);
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_idx_fixture OUT_DIR\n");
    return 2;
  }
  try {
    const fs::path out = argv[1];
    fs::remove_all(out);
    std::mt19937 rng(20240611);
    const Split train = make_split(kTrainCount, rng);
    const Split test = make_split(kTestCount, rng);
    const Files files = encode(train, test);

    write_set(out / "good", files);

    // The raw test images lose their last 100 bytes.
    write_set(out / "truncated", files);
    cut_file(out / "truncated" / "t10k-images-idx3-ubyte", files.test_images.size() - 100);

    // The gzipped training images stop in the middle of the compressed stream.
    write_set(out / "truncated_gz", files);
    const fs::path gz = out / "truncated_gz" / "train-images-idx3-ubyte.gz";
    cut_file(gz, fs::file_size(gz) / 2);

    // An images file where the training labels belong: the magic says 0x803, not 0x801.
    Files bad_magic = files;
    bad_magic.train_labels = files.test_images;
    write_set(out / "bad_magic", bad_magic);

    // One test label fewer than test images.
    Split short_test = test;
    short_test.labels.pop_back();
    Files mismatched = files;
    mismatched.test_labels = encode(train, short_test).test_labels;
    write_set(out / "mismatched", mismatched);

    // A training label of 10 in a 10-class dataset.
    Split bad_train = train;
    bad_train.labels[17] = kClasses;
    write_set(out / "bad_label", encode(bad_train, test));

    // No test images at all.
    write_set(out / "missing_file", files);
    fs::remove(out / "missing_file" / "t10k-images-idx3-ubyte");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "make_idx_fixture: %s\n", error.what());
    return 1;
  }
  return 0;
}
