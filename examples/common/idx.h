// Reader for MNIST-format IDX files (raw or gzip-compressed), shared by amp's examples.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace amp_examples {

/// A data file that is missing, unreadable or malformed. The message names the file and says what
/// is wrong with it, so a program can print it as it is.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Magic number of an IDX file holding unsigned bytes in 3 dimensions (MNIST images).
inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;
/// Magic number of an IDX file holding unsigned bytes in 1 dimension (MNIST labels).
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;

/// The contents of an IDX file of unsigned bytes: its dimensions and its values in row-major order.
struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> values;
};

/// Parses the bytes of an IDX file.
/// Args: bytes: the whole (already decompressed) file; expected_magic: kIdxImagesMagic or
///   kIdxLabelsMagic; source: the file's name, used in error messages.
/// Returns: the dimensions and values.
/// Errors: DataError when the header is short, the magic number differs from expected_magic, or
///   the data is shorter or longer than the dimensions say.
IdxArray parse_idx(std::span<const std::uint8_t> bytes, std::uint32_t expected_magic,
                   std::string_view source);

/// The largest (decompressed) IDX file the readers accept: 2 GiB, ~40 times Fashion-MNIST's
/// training images, so that a damaged header or a gzip bomb fails with a message rather than
/// exhausting memory.
inline constexpr std::uint64_t kMaxIdxBytes = std::uint64_t{2} << 30;

/// Reads a whole file into memory, decompressing it when it is gzip-compressed (decided by its
/// content, not its name).
/// Args: path: the file; max_bytes: the most (decompressed) bytes to accept.
/// Returns: the (decompressed) bytes.
/// Errors: DataError when the file is missing, a folder, not a regular file (a FIFO...),
///   unreadable, a corrupt or truncated gzip stream, or longer than max_bytes.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path,
                                          std::uint64_t max_bytes = kMaxIdxBytes);

/// Reads and parses an IDX file (raw or gzip-compressed), decompressing no more than its header
/// describes (at most kMaxIdxBytes).
/// Args: path: the file; expected_magic: as for parse_idx.
/// Returns: the dimensions and values.
/// Errors: DataError as for read_file_bytes and parse_idx, naming the file; also when the header
///   promises more than kMaxIdxBytes or the data goes on past what it promises.
IdxArray read_idx(const std::filesystem::path& path, std::uint32_t expected_magic);

/// Finds an IDX file in a folder by its base name: `<dir>/<stem>` (raw) if it exists, else
/// `<dir>/<stem>.gz`. The raw file wins because it needs no decompression.
/// Args: dir: the folder; stem: e.g. "train-images-idx3-ubyte".
/// Returns: the path of the file found.
/// Errors: DataError when the folder or both files are missing.
std::filesystem::path find_idx_file(const std::filesystem::path& dir, std::string_view stem);

/// Which half of an MNIST-format dataset to load.
enum class MnistSplit { kTrain, kTest };

/// One half of an MNIST-format dataset: `count` images of rows x cols bytes, and their labels.
struct MnistData {
  std::int64_t count = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::uint8_t> images;  ///< count * rows * cols pixel values, 0 (background) to 255.
  std::vector<std::uint8_t> labels;  ///< count class indices, each below num_classes.
  std::filesystem::path images_file;
  std::filesystem::path labels_file;
};

/// Loads the training or test half of an MNIST-format dataset (MNIST, Fashion-MNIST) from the
/// files train-images-idx3-ubyte / train-labels-idx1-ubyte or t10k-images-idx3-ubyte /
/// t10k-labels-idx1-ubyte in `dir`, each raw or with a .gz suffix.
/// Args: dir: the folder; split: which half; num_classes: labels must be below it.
/// Returns: the images and labels.
/// Errors: DataError when a file is missing or malformed, the image and label counts differ, or
///   a label is num_classes or more.
MnistData load_mnist(const std::filesystem::path& dir, MnistSplit split, int num_classes = 10);

}  // namespace amp_examples
