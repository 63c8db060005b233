// The examples' MNIST-format data as tensors: shapes, dtypes, the [0, 1] scaling, standardisation
// by the training pixels' statistics, and the image-size check.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "common/idx.h"
#include "common/mnist_tensors.h"
#include "examples/idx_writer.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using amp_examples::Pixels;
using amp_test::Bytes;
using amp_test::TempDir;

// Pixel i of image n: (n * 37 + i * 11) mod 256, so every image and position differs.
Bytes pixels(std::uint32_t count, std::uint32_t side, std::uint32_t first_image) {
  Bytes values(static_cast<std::size_t>(count) * side * side);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::size_t image = first_image + i / (side * side);
    values[i] = static_cast<std::uint8_t>((image * 37 + (i % (side * side)) * 11) % 256);
  }
  return values;
}

// Writes <prefix>-images-idx3-ubyte and <prefix>-labels-idx1-ubyte: `count` images of side x side
// pixels (see pixels()), labels 9, 8, 7, ...
void write_half(const fs::path& dir, const std::string& prefix, std::uint32_t count,
                std::uint32_t side, std::uint32_t first_image) {
  Bytes labels(count);
  for (std::uint32_t i = 0; i < count; ++i) labels[i] = static_cast<std::uint8_t>(9 - i % 10);
  amp_test::write_raw(dir / (prefix + "-images-idx3-ubyte"),
                      amp_test::encode_idx(amp_test::kIdxImagesMagic, {count, side, side},
                                           pixels(count, side, first_image)));
  amp_test::write_raw(dir / (prefix + "-labels-idx1-ubyte"),
                      amp_test::encode_idx(amp_test::kIdxLabelsMagic, {count}, labels));
}

// Writes both halves into `dir`: `train` training images (images 0, 1, ...) and `test` test
// images (the images after them), side x side pixels each.
void write_halves(const fs::path& dir, std::uint32_t train, std::uint32_t test,
                  std::uint32_t side) {
  write_half(dir, "train", train, side, 0);
  write_half(dir, "t10k", test, side, train);
}

// The halves write_halves(dir, train, test, 28) writes, loaded with `mode` on the CPU.
amp_examples::ImageData write_and_load(const fs::path& dir, std::uint32_t train, std::uint32_t test,
                                       Pixels mode) {
  write_halves(dir, train, test, 28);
  return amp_examples::load_image_data(dir, mode, c10::DeviceType::CPU);
}

}  // namespace

TEST_CASE("Both halves load as [N, 1, 28, 28] float32 images in [0, 1] and int64 labels",
          "[examples]") {
  TempDir dir("mnist_tensors_tests");
  const amp_examples::ImageData data = write_and_load(dir.path(), 3, 2, Pixels::kUnitRange);

  CHECK(data.train.size() == 3);
  CHECK(data.test.size() == 2);
  CHECK(data.train.images.sizes() == torch::IntArrayRef({3, 1, 28, 28}));
  CHECK(data.train.images.scalar_type() == torch::kFloat32);
  CHECK(data.test.labels.scalar_type() == torch::kInt64);
  CHECK(torch::equal(data.test.labels, torch::tensor({9, 8}, torch::kInt64)));
  // Each pixel is its byte divided by 255 in float32, as torchvision's ToTensor computes it.
  const Bytes test_bytes = pixels(2, 28, 3);
  const auto* values = data.test.images.contiguous().data_ptr<float>();
  for (std::size_t i = 0; i < test_bytes.size(); ++i) {
    CAPTURE(i);
    REQUIRE(values[i] == static_cast<float>(test_bytes[i]) / 255.0F);
  }
}

TEST_CASE("Standardised pixels use the training set's mean and deviation for both halves",
          "[examples]") {
  TempDir dir("mnist_tensors_tests");
  const amp_examples::ImageData data = write_and_load(dir.path(), 4, 2, Pixels::kStandardised);

  // The training pixels' mean and sample standard deviation (n - 1, as torch.std), in double.
  const Bytes train_bytes = pixels(4, 28, 0);
  double sum = 0;
  for (std::uint8_t byte : train_bytes) sum += byte / 255.0;
  const double mean = sum / static_cast<double>(train_bytes.size());
  double squares = 0;
  for (std::uint8_t byte : train_bytes) squares += (byte / 255.0 - mean) * (byte / 255.0 - mean);
  const double deviation = std::sqrt(squares / static_cast<double>(train_bytes.size() - 1));

  const Bytes test_bytes = pixels(2, 28, 4);
  const auto* values = data.test.images.contiguous().data_ptr<float>();
  for (std::size_t i = 0; i < test_bytes.size(); ++i) {
    CAPTURE(i);
    REQUIRE(values[i] ==
            Approx((test_bytes[i] / 255.0 - mean) / deviation).epsilon(1e-5).margin(1e-6));
  }
  CHECK(data.train.images.mean().item<double>() == Approx(0.0).margin(1e-5));
  CHECK(data.train.images.std().item<double>() == Approx(1.0).epsilon(1e-5));
}

TEST_CASE("Images of another size than 28x28 are refused, naming the file", "[examples]") {
  TempDir dir("mnist_tensors_tests");
  write_halves(dir.path(), 2, 2, 14);
  CHECK_THROWS_MATCHES(
      amp_examples::load_image_data(dir.path(), Pixels::kUnitRange, c10::DeviceType::CPU),
      amp_examples::DataError,
      Catch::Matchers::Message((dir.path() / "train-images-idx3-ubyte").string() +
                               ": the images are 14x14 pixels; this model takes 28x28 images"));
}

TEST_CASE("The --data option names the dataset's folder, defaulting to the one given",
          "[examples]") {
  fs::path data = "/usr/share/datasets/fashion-mnist";
  amp_examples::CommandLine cli("prog", "Trains.");
  amp_examples::add_data_option(cli, data);
  CHECK_THAT(cli.usage(),
             Catch::Contains("--data DIR  folder with {train,t10k}-{images-idx3,labels-idx1}-"
                             "ubyte[.gz] (default /usr/share/datasets/fashion-mnist)"));
  const std::vector<const char*> args = {"prog", "--data", "/tmp/mnist"};
  CHECK(cli.parse(static_cast<int>(args.size()), args.data()));
  CHECK(data == "/tmp/mnist");
}
