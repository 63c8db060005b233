// Reader for MNIST-format IDX files: gzip via zlib, header and size checks, MNIST file pairing.
#include "idx.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <system_error>
#include <type_traits>

namespace amp_examples {
namespace {

// IDX stores every integer big-endian, whatever the machine's byte order.
std::uint32_t read_big_endian_u32(std::span<const std::uint8_t> bytes, std::size_t offset) {
  return (std::uint32_t{bytes[offset]} << 24) | (std::uint32_t{bytes[offset + 1]} << 16) |
         (std::uint32_t{bytes[offset + 2]} << 8) | std::uint32_t{bytes[offset + 3]};
}

std::string describe_magic(std::uint32_t magic) {
  const unsigned ndims = magic & 0xffu;
  return fmt::format("0x{:08x}, an IDX file of unsigned bytes with {} dimension{}", magic, ndims,
                     ndims == 1 ? "" : "s");
}

std::string join_dims(const std::vector<std::uint32_t>& dims) {
  return fmt::format("{}", fmt::join(dims, " x "));
}

// zlib's gzerror() text starts with "<path>: "; the caller names the file itself.
std::string_view without_path_prefix(std::string_view message, const std::filesystem::path& path) {
  const std::string prefix = path.string() + ": ";
  if (message.starts_with(prefix)) message.remove_prefix(prefix.size());
  return message;
}

struct GzFileCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFilePtr = std::unique_ptr<std::remove_pointer_t<gzFile>, GzFileCloser>;

}  // namespace

IdxArray parse_idx(std::span<const std::uint8_t> bytes, std::uint32_t expected_magic,
                   std::string_view source) {
  constexpr std::size_t kMagicBytes = 4;
  if (bytes.size() < kMagicBytes) {
    throw DataError(fmt::format(
        "{}: the file has {} bytes, too few for an IDX header (it starts with a 4-byte magic "
        "number); the file is truncated or not an IDX file",
        source, bytes.size()));
  }
  const std::uint32_t magic = read_big_endian_u32(bytes, 0);
  if (magic != expected_magic) {
    throw DataError(fmt::format("{}: bad magic number 0x{:08x}; expected {}. Is it the right file?",
                                source, magic, describe_magic(expected_magic)));
  }

  const std::size_t ndims = expected_magic & 0xffu;
  const std::size_t header_bytes = kMagicBytes + 4 * ndims;
  if (bytes.size() < header_bytes) {
    throw DataError(fmt::format(
        "{}: truncated header: {} dimensions need {} header bytes but the file has only {}", source,
        ndims, header_bytes, bytes.size()));
  }
  IdxArray array;
  array.dims.reserve(ndims);
  for (std::size_t i = 0; i < ndims; ++i) {
    array.dims.push_back(read_big_endian_u32(bytes, kMagicBytes + 4 * i));
  }

  // Three 32-bit sizes can multiply past 64 bits; a wrapped product must not pass for a small one.
  const std::size_t data_bytes = bytes.size() - header_bytes;
  std::uint64_t needed = 1;
  bool overflow = false;
  for (std::uint32_t dim : array.dims) overflow |= __builtin_mul_overflow(needed, dim, &needed);
  if (overflow) needed = std::numeric_limits<std::uint64_t>::max();
  if (std::find(array.dims.begin(), array.dims.end(), 0u) != array.dims.end()) {
    needed = 0;
    overflow = false;
  }
  if (needed > data_bytes) {
    throw DataError(fmt::format(
        "{}: truncated: the header promises {} values ({} bytes of data) but the file has only {} "
        "bytes after its {}-byte header",
        source, join_dims(array.dims),
        overflow ? std::string("more than 2^64") : std::to_string(needed), data_bytes,
        header_bytes));
  }
  if (needed < data_bytes) {
    throw DataError(fmt::format(
        "{}: {} unexpected bytes after the {} values ({} bytes) the header describes; the file "
        "is corrupt or not an IDX file",
        source, data_bytes - needed, join_dims(array.dims), needed));
  }
  array.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header_bytes), bytes.end());
  return array;
}

namespace {

// A file opened for reading through zlib, which passes a file that is not gzip-compressed through
// unchanged, so one path serves both. Only regular files are opened: a folder or a FIFO would
// otherwise be reported as missing, or block.
class DataFile {
 public:
  explicit DataFile(const std::filesystem::path& path) : path_(path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(status)) {
      throw DataError(fmt::format("{}: no such file", path.string()));
    }
    if (std::filesystem::is_directory(status)) {
      throw DataError(fmt::format("{}: is a folder, not a data file", path.string()));
    }
    if (!std::filesystem::is_regular_file(status)) {
      throw DataError(fmt::format(
          "{}: is not a regular file (a FIFO, socket or device); name a data file", path.string()));
    }
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) {
      throw DataError(fmt::format("{}: cannot open the file for reading", path.string()));
    }
    gzbuffer(file_.get(), kChunkBytes);
  }

  // Appends up to `count` more (decompressed) bytes to `bytes`, growing it by what arrives rather
  // than by `count`, so a size promised by a header costs memory only once the data is there.
  // Returns how many were appended (fewer at the end of the file).
  std::uint64_t read(std::vector<std::uint8_t>& bytes, std::uint64_t count) {
    std::uint64_t appended = 0;
    while (appended < count) {
      const auto want =
          static_cast<unsigned>(std::min<std::uint64_t>(count - appended, kChunkBytes));
      const std::size_t old_size = bytes.size();
      bytes.resize(old_size + want);
      const int got = gzread(file_.get(), bytes.data() + old_size, want);
      if (got < 0) {
        int code = Z_OK;
        const char* message = gzerror(file_.get(), &code);
        throw DataError(fmt::format(
            "{}: cannot read or decompress the file: {}", path_.string(),
            code == Z_ERRNO ? std::strerror(errno) : without_path_prefix(message, path_)));
      }
      bytes.resize(old_size + static_cast<std::size_t>(got));
      appended += static_cast<std::uint64_t>(got);
      if (got == 0) break;
    }
    return appended;
  }

  // A gzip stream cut short still yields the bytes before the cut; zlib only flags it here.
  void check_stream() const {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    if (code != Z_OK && code != Z_STREAM_END) {
      throw DataError(
          fmt::format("{}: the gzip stream is corrupt or truncated: {}", path_.string(), message));
    }
  }

 private:
  static constexpr unsigned kChunkBytes = 1u << 20;
  std::filesystem::path path_;
  GzFilePtr file_;
};

std::string byte_count(std::uint64_t bytes) {
  return bytes >= (std::uint64_t{1} << 30) ? fmt::format("{} GiB", bytes >> 30)
                                           : fmt::format("{} bytes", bytes);
}

}  // namespace

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path,
                                          std::uint64_t max_bytes) {
  DataFile file(path);
  std::vector<std::uint8_t> bytes;
  if (file.read(bytes, max_bytes) == max_bytes && file.read(bytes, 1) != 0) {
    throw DataError(fmt::format(
        "{}: the file holds (or decompresses to) more than {}, the most this reader accepts; "
        "it is corrupt or not a data file",
        path.string(), byte_count(max_bytes)));
  }
  file.check_stream();
  return bytes;
}

IdxArray read_idx(const std::filesystem::path& path, std::uint32_t expected_magic) {
  // The header says how many bytes follow; nothing beyond them is decompressed, so a small
  // gzip file that inflates to gigabytes costs no more than the header admits.
  DataFile file(path);
  const std::uint64_t header_bytes = 4 + 4 * std::uint64_t{expected_magic & 0xffu};
  std::vector<std::uint8_t> bytes;
  file.read(bytes, header_bytes);
  if (bytes.size() < header_bytes || read_big_endian_u32(bytes, 0) != expected_magic) {
    file.check_stream();
    return parse_idx(bytes, expected_magic, path.string());  // throws, naming what is wrong
  }
  // Three 32-bit sizes can multiply past 64 bits; a zero size makes the product 0 regardless.
  std::uint64_t values = 1;
  bool overflow = false;
  bool empty = false;
  for (std::uint64_t offset = 4; offset < header_bytes; offset += 4) {
    const std::uint32_t dim = read_big_endian_u32(bytes, offset);
    empty |= dim == 0;
    overflow |= __builtin_mul_overflow(values, dim, &values);
  }
  if (empty) values = 0;
  if (!empty && (overflow || values > kMaxIdxBytes - header_bytes)) {
    throw DataError(fmt::format(
        "{}: the header promises {} values, more than the {} this reader accepts; the file is "
        "corrupt or not an MNIST-format file",
        path.string(), overflow ? std::string("more than 2^64") : std::to_string(values),
        byte_count(kMaxIdxBytes)));
  }
  file.read(bytes, values);
  if (bytes.size() == header_bytes + values && file.read(bytes, 1) != 0) {
    throw DataError(fmt::format(
        "{}: more data than the {} values the header describes; the file is corrupt or not an "
        "IDX file",
        path.string(), values));
  }
  file.check_stream();
  return parse_idx(bytes, expected_magic, path.string());
}

std::filesystem::path find_idx_file(const std::filesystem::path& dir, std::string_view stem) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw DataError(
        fmt::format("{}: the data folder does not exist or is not a folder", dir.string()));
  }
  const std::filesystem::path raw = dir / std::string(stem);
  if (std::filesystem::exists(raw, ec)) return raw;
  std::filesystem::path gz = raw;
  gz += ".gz";
  if (std::filesystem::exists(gz, ec)) return gz;
  throw DataError(
      fmt::format("{}: missing data file: neither {} nor {}.gz exists", dir.string(), stem, stem));
}

MnistData load_mnist(const std::filesystem::path& dir, MnistSplit split, int num_classes) {
  const std::string_view prefix = split == MnistSplit::kTrain ? "train" : "t10k";
  MnistData data;
  data.images_file = find_idx_file(dir, fmt::format("{}-images-idx3-ubyte", prefix));
  data.labels_file = find_idx_file(dir, fmt::format("{}-labels-idx1-ubyte", prefix));

  IdxArray images = read_idx(data.images_file, kIdxImagesMagic);
  IdxArray labels = read_idx(data.labels_file, kIdxLabelsMagic);
  if (images.dims[0] != labels.dims[0]) {
    throw DataError(fmt::format(
        "{} holds {} images but {} holds {} labels; the two files must belong to the same dataset",
        data.images_file.string(), images.dims[0], data.labels_file.string(), labels.dims[0]));
  }
  if (images.dims[0] == 0) {
    throw DataError(fmt::format("{}: the file holds no images", data.images_file.string()));
  }
  const auto bad_label = std::find_if(labels.values.begin(), labels.values.end(),
                                      [&](std::uint8_t label) { return label >= num_classes; });
  if (bad_label != labels.values.end()) {
    throw DataError(fmt::format("{}: label {} at index {} is out of range; labels must be below {}",
                                data.labels_file.string(), *bad_label,
                                bad_label - labels.values.begin(), num_classes));
  }

  data.count = images.dims[0];
  data.rows = images.dims[1];
  data.cols = images.dims[2];
  data.images = std::move(images.values);
  data.labels = std::move(labels.values);
  return data;
}

}  // namespace amp_examples
