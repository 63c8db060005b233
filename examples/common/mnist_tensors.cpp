// Loading MNIST-format data into tensors: checks, scaling, standardisation, the move to a device.
#include "mnist_tensors.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>

#include <optional>

#include "idx.h"

namespace amp_examples {
namespace {

struct PixelStats {
  double mean;
  double std;
};

// The mean and standard deviation of all the pixels in [0, 1], in float64.
PixelStats pixel_stats(MnistData& data) {
  const at::Tensor pixels =
      at::from_blob(data.images.data(), {static_cast<std::int64_t>(data.images.size())}, at::kByte)
          .to(at::kDouble)
          .div_(255);
  return {pixels.mean().item<double>(), pixels.std().item<double>()};
}

ImageSet to_tensors(MnistData& data, const std::optional<PixelStats>& stats,
                    c10::DeviceType device) {
  if (data.rows != kImageSide || data.cols != kImageSide) {
    throw DataError(fmt::format("{}: the images are {}x{} pixels; this model takes {}x{} images",
                                data.images_file.string(), data.rows, data.cols, kImageSide,
                                kImageSide));
  }
  // from_blob only views the bytes; the conversions copy them into tensors that own their memory.
  at::Tensor images =
      at::from_blob(data.images.data(), {data.count, 1, kImageSide, kImageSide}, at::kByte)
          .to(at::kFloat)
          .div_(255);
  if (stats) images.sub_(stats->mean).div_(stats->std);
  const at::Tensor labels = at::from_blob(data.labels.data(), {data.count}, at::kByte);
  return {images.to(device), labels.to(at::kLong).to(device)};
}

}  // namespace

void add_data_option(CommandLine& cli, std::filesystem::path& dir) {
  cli.add_option("data", "DIR",
                 fmt::format("folder with {{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] "
                             "(default {})",
                             dir.string()),
                 [&dir](std::string_view value) { dir = value; });
}

ImageData load_image_data(const std::filesystem::path& dir, Pixels pixels, c10::DeviceType device) {
  MnistData train = load_mnist(dir, MnistSplit::kTrain, kNumClasses);
  std::optional<PixelStats> stats;
  if (pixels == Pixels::kStandardised) stats = pixel_stats(train);
  ImageSet train_set = to_tensors(train, stats, device);
  MnistData test = load_mnist(dir, MnistSplit::kTest, kNumClasses);
  return {std::move(train_set), to_tensors(test, stats, device)};
}

}  // namespace amp_examples
