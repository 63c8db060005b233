// MNIST-format datasets as tensors for the training examples: both halves read with the IDX
// reader, scaled like torchvision's ToTensor, optionally standardised, and moved to the device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <filesystem>

#include "cli.h"

namespace amp_examples {

/// The images of an MNIST-format dataset are 28x28 pixels, of 10 classes.
inline constexpr std::int64_t kImageSide = 28;
inline constexpr std::int64_t kImagePixels = kImageSide * kImageSide;
inline constexpr std::int64_t kNumClasses = 10;

/// One half of a dataset: images [N, 1, 28, 28] float32, labels [N] int64.
struct ImageSet {
  at::Tensor images;
  at::Tensor labels;

  std::int64_t size() const { return labels.size(0); }
};

/// The training and test halves.
struct ImageData {
  ImageSet train;
  ImageSet test;
};

/// How the pixels are presented to the model.
enum class Pixels {
  /// In [0, 1]: the byte values divided by 255 (torchvision's ToTensor).
  kUnitRange,
  /// In [0, 1], then shifted and scaled by the mean and standard deviation of all the training
  /// pixels, for both halves, so the test set is standardised the way the model saw its
  /// training data.
  kStandardised,
};

/// Registers --data DIR, the dataset's folder, into `dir` (which holds the default).
void add_data_option(CommandLine& cli, std::filesystem::path& dir);

/// Loads the training and test halves of the MNIST-format dataset in `dir` (see load_mnist) onto
/// `device`, all of it: the largest, Fashion-MNIST's training set, is 188 MB as float32, and
/// batches are then gathered where they are used.
/// Errors: DataError as for load_mnist, and when the images are not 28x28 pixels.
ImageData load_image_data(const std::filesystem::path& dir, Pixels pixels, c10::DeviceType device);

}  // namespace amp_examples
