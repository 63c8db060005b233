// The examples' IDX reader: header parsing, size checks, gzip and raw files, MNIST file pairing.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "common/idx.h"
#include "examples/idx_writer.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using amp_examples::DataError;
using amp_examples::kIdxImagesMagic;
using amp_examples::kIdxLabelsMagic;
using amp_test::Bytes;
using amp_test::encode_idx;
using amp_test::TempDir;
using Catch::Contains;

Bytes iota_bytes(std::size_t count) {
  Bytes values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<std::uint8_t>(i * 7);
  return values;
}

// A consistent MNIST-format pair of `count` 28x28 images and labels 0, 1, ..., 9, 0, ...
void write_mnist_pair(const fs::path& dir, const std::string& prefix, std::uint32_t count) {
  Bytes labels(count);
  for (std::uint32_t i = 0; i < count; ++i) labels[i] = static_cast<std::uint8_t>(i % 10);
  amp_test::write_gzip(dir / (prefix + "-images-idx3-ubyte.gz"),
                       encode_idx(kIdxImagesMagic, {count, 28, 28}, iota_bytes(count * 28 * 28)));
  amp_test::write_raw(dir / (prefix + "-labels-idx1-ubyte"),
                      encode_idx(kIdxLabelsMagic, {count}, labels));
}

}  // namespace

TEST_CASE("An IDX file is parsed into its big-endian dimensions and its values", "[examples]") {
  const Bytes values = iota_bytes(2 * 3 * 300);
  const Bytes file = encode_idx(kIdxImagesMagic, {2, 3, 300}, values);
  const amp_examples::IdxArray array = amp_examples::parse_idx(file, kIdxImagesMagic, "x.idx");
  CHECK(array.dims == std::vector<std::uint32_t>{2, 3, 300});
  CHECK(array.values == values);

  const amp_examples::IdxArray labels =
      amp_examples::parse_idx(encode_idx(kIdxLabelsMagic, {4}, {9, 0, 3, 1}), kIdxLabelsMagic, "l");
  CHECK(labels.dims == std::vector<std::uint32_t>{4});
  CHECK(labels.values == Bytes{9, 0, 3, 1});
}

TEST_CASE("An IDX file with a zero dimension holds no values", "[examples]") {
  const amp_examples::IdxArray array =
      amp_examples::parse_idx(encode_idx(kIdxImagesMagic, {0, 28, 28}, {}), kIdxImagesMagic, "e");
  CHECK(array.dims == std::vector<std::uint32_t>{0, 28, 28});
  CHECK(array.values.empty());
}

TEST_CASE("A magic number other than the expected one is an error naming both", "[examples]") {
  const Bytes images = encode_idx(kIdxImagesMagic, {1, 1, 1}, {5});
  CHECK_THROWS_MATCHES(
      amp_examples::parse_idx(images, kIdxLabelsMagic, "labels.idx"), DataError,
      Catch::Matchers::Message(
          "labels.idx: bad magic number 0x00000803; expected 0x00000801, an IDX file of unsigned "
          "bytes with 1 dimension. Is it the right file?"));
  // A float IDX file (type byte 0x0d) is not accepted as bytes either.
  CHECK_THROWS_WITH(amp_examples::parse_idx(encode_idx(0x00000d03, {1, 1, 1}, {0, 0, 0, 0}),
                                            kIdxImagesMagic, "f.idx"),
                    Contains("bad magic number 0x00000d03; expected 0x00000803, an IDX file of "
                             "unsigned bytes with 3 dimensions"));
}

TEST_CASE("A file too short for its magic number or header is an error", "[examples]") {
  CHECK_THROWS_WITH(amp_examples::parse_idx(Bytes{0, 0, 8}, kIdxImagesMagic, "tiny"),
                    Contains("tiny: the file has 3 bytes, too few for an IDX header"));
  CHECK_THROWS_WITH(amp_examples::parse_idx(Bytes{}, kIdxLabelsMagic, "empty"),
                    Contains("empty: the file has 0 bytes"));
  Bytes header = encode_idx(kIdxImagesMagic, {10, 28, 28}, {});
  header.resize(10);
  CHECK_THROWS_WITH(
      amp_examples::parse_idx(header, kIdxImagesMagic, "cut"),
      Contains(
          "cut: truncated header: 3 dimensions need 16 header bytes but the file has only 10"));
}

TEST_CASE("Data shorter or longer than the dimensions say is an error with both sizes",
          "[examples]") {
  Bytes file = encode_idx(kIdxImagesMagic, {3, 4, 5}, iota_bytes(60));
  SECTION("one byte missing") {
    file.pop_back();
    CHECK_THROWS_WITH(amp_examples::parse_idx(file, kIdxImagesMagic, "short"),
                      Contains("short: truncated: the header promises 3 x 4 x 5 values (60 bytes "
                               "of data) but the file has only 59 bytes after its 16-byte header"));
  }
  SECTION("one byte too many") {
    file.push_back(0);
    CHECK_THROWS_WITH(amp_examples::parse_idx(file, kIdxImagesMagic, "long"),
                      Contains("long: 1 unexpected bytes after the 3 x 4 x 5 values (60 bytes)"));
  }
}

TEST_CASE("Dimensions whose product overflows 64 bits are reported, not wrapped around",
          "[examples]") {
  // 2^32-1 cubed wraps to a small number in 64-bit arithmetic; the reader must not accept that.
  const Bytes file = encode_idx(kIdxImagesMagic, {0xffffffffu, 0xffffffffu, 0xffffffffu}, {1, 2});
  CHECK_THROWS_WITH(
      amp_examples::parse_idx(file, kIdxImagesMagic, "huge"),
      Contains("huge: truncated: the header promises 4294967295 x 4294967295 x "
               "4294967295 values (more than 2^64 bytes of data) but the file has only 2"));
}

TEST_CASE("A gzipped IDX file reads the same as the raw one", "[examples]") {
  TempDir dir("idx_tests");
  const Bytes file = encode_idx(kIdxLabelsMagic, {5000}, iota_bytes(5000));
  amp_test::write_raw(dir.path() / "raw", file);
  amp_test::write_gzip(dir.path() / "packed.gz", file);
  CHECK(fs::file_size(dir.path() / "packed.gz") < file.size());
  CHECK(amp_examples::read_file_bytes(dir.path() / "raw") == file);
  CHECK(amp_examples::read_file_bytes(dir.path() / "packed.gz") == file);
  CHECK(amp_examples::read_idx(dir.path() / "packed.gz", kIdxLabelsMagic).values ==
        iota_bytes(5000));
}

TEST_CASE("Missing, unreadable-as-gzip and truncated gzip files are errors naming the file",
          "[examples]") {
  TempDir dir("idx_tests");
  CHECK_THROWS_WITH(amp_examples::read_file_bytes(dir.path() / "absent"),
                    Contains((dir.path() / "absent").string() + ": no such file"));
  CHECK_THROWS_WITH(amp_examples::read_file_bytes(dir.path()),
                    Contains(dir.path().string() + ": is a folder, not a data file"));

  const fs::path gz = dir.path() / "cut.gz";
  amp_test::write_gzip(gz, iota_bytes(100000));
  fs::resize_file(gz, fs::file_size(gz) - 20);
  CHECK_THROWS_WITH(amp_examples::read_file_bytes(gz),
                    Contains(gz.string() + ": the gzip stream is corrupt or truncated"));
}

TEST_CASE("find_idx_file prefers the raw file, falls back to .gz and names what is missing",
          "[examples]") {
  TempDir dir("idx_tests");
  CHECK_THROWS_WITH(amp_examples::find_idx_file(dir.path() / "nope", "a-idx1-ubyte"),
                    Contains("nope: the data folder does not exist or is not a folder"));
  CHECK_THROWS_WITH(amp_examples::find_idx_file(dir.path(), "a-idx1-ubyte"),
                    Contains("missing data file: neither a-idx1-ubyte nor a-idx1-ubyte.gz exists"));
  amp_test::write_raw(dir.path() / "a-idx1-ubyte.gz", {});
  CHECK(amp_examples::find_idx_file(dir.path(), "a-idx1-ubyte") == dir.path() / "a-idx1-ubyte.gz");
  amp_test::write_raw(dir.path() / "a-idx1-ubyte", {});
  CHECK(amp_examples::find_idx_file(dir.path(), "a-idx1-ubyte") == dir.path() / "a-idx1-ubyte");
}

TEST_CASE("load_mnist pairs images with labels and checks counts and label range", "[examples]") {
  TempDir dir("idx_tests");
  write_mnist_pair(dir.path(), "train", 12);
  write_mnist_pair(dir.path(), "t10k", 3);

  const amp_examples::MnistData train =
      amp_examples::load_mnist(dir.path(), amp_examples::MnistSplit::kTrain);
  CHECK(train.count == 12);
  CHECK(train.rows == 28);
  CHECK(train.cols == 28);
  CHECK(train.images == iota_bytes(12 * 28 * 28));
  CHECK(train.labels == Bytes{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1});
  CHECK(train.images_file == dir.path() / "train-images-idx3-ubyte.gz");
  CHECK(amp_examples::load_mnist(dir.path(), amp_examples::MnistSplit::kTest).count == 3);

  SECTION("a label at the class count is out of range") {
    CHECK_THROWS_WITH(
        amp_examples::load_mnist(dir.path(), amp_examples::MnistSplit::kTrain, 9),
        Contains("train-labels-idx1-ubyte: label 9 at index 9 is out of range; labels must be "
                 "below 9"));
  }
  SECTION("fewer labels than images") {
    amp_test::write_raw(dir.path() / "t10k-labels-idx1-ubyte",
                        encode_idx(kIdxLabelsMagic, {2}, {1, 2}));
    CHECK_THROWS_WITH(amp_examples::load_mnist(dir.path(), amp_examples::MnistSplit::kTest),
                      Contains("t10k-images-idx3-ubyte.gz holds 3 images but") &&
                          Contains("t10k-labels-idx1-ubyte holds 2 labels"));
  }
  SECTION("no images at all") {
    amp_test::write_raw(dir.path() / "t10k-images-idx3-ubyte",
                        encode_idx(kIdxImagesMagic, {0, 28, 28}, {}));
    amp_test::write_raw(dir.path() / "t10k-labels-idx1-ubyte",
                        encode_idx(kIdxLabelsMagic, {0}, {}));
    CHECK_THROWS_WITH(amp_examples::load_mnist(dir.path(), amp_examples::MnistSplit::kTest),
                      Contains("t10k-images-idx3-ubyte: the file holds no images"));
  }
}

TEST_CASE("A FIFO in place of a data file is refused without blocking", "[examples]") {
  TempDir dir("idx_tests");
  const fs::path fifo = dir.path() / "train-labels-idx1-ubyte";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(amp_examples::read_idx(fifo, kIdxLabelsMagic),
                    Contains(fifo.string() + ": is not a regular file (a FIFO, socket or device)"));
}

TEST_CASE("A gzip bomb is read only as far as its header's sizes go", "[examples]") {
  // 10 labels, then 32 MiB of zeros: a ~32 KiB file that inflates a thousandfold.
  TempDir dir("idx_tests");
  Bytes file = encode_idx(kIdxLabelsMagic, {10}, iota_bytes(10));
  file.resize(file.size() + (std::size_t{32} << 20), 0);
  const fs::path bomb = dir.path() / "bomb.gz";
  amp_test::write_gzip(bomb, file);
  REQUIRE(fs::file_size(bomb) < (std::size_t{1} << 20));
  CHECK_THROWS_WITH(amp_examples::read_idx(bomb, kIdxLabelsMagic),
                    Contains(bomb.string() + ": more data than the 10 values the header "
                                             "describes; the file is corrupt or not an IDX file"));
  // Reading it whole stops at the limit given.
  CHECK_THROWS_WITH(amp_examples::read_file_bytes(bomb, 1000),
                    Contains(bomb.string() + ": the file holds (or decompresses to) more than "
                                             "1000 bytes, the most this reader accepts"));
}

TEST_CASE("A header promising more than the reader accepts is refused before reading on",
          "[examples]") {
  TempDir dir("idx_tests");
  const fs::path huge = dir.path() / "huge.gz";
  amp_test::write_gzip(huge, encode_idx(kIdxImagesMagic, {100000, 1000, 1000}, iota_bytes(64)));
  CHECK_THROWS_WITH(amp_examples::read_idx(huge, kIdxImagesMagic),
                    Contains(huge.string() + ": the header promises 100000000000 values, more "
                                             "than the 2 GiB this reader accepts"));
  const fs::path wrapped = dir.path() / "wrapped";
  amp_test::write_raw(wrapped,
                      encode_idx(kIdxImagesMagic, {0xffffffffu, 0xffffffffu, 0xffffffffu}, {1}));
  CHECK_THROWS_WITH(amp_examples::read_idx(wrapped, kIdxImagesMagic),
                    Contains("promises more than 2^64 values"));
  // A zero dimension is an empty array whatever the others say.
  const fs::path empty = dir.path() / "empty";
  amp_test::write_raw(empty, encode_idx(kIdxImagesMagic, {0, 0xffffffffu, 0xffffffffu}, {}));
  CHECK(amp_examples::read_idx(empty, kIdxImagesMagic).values.empty());
  // A header promising more than the file holds is the parser's truncation error.
  const fs::path cut = dir.path() / "cut";
  amp_test::write_raw(cut, encode_idx(kIdxImagesMagic, {1000, 28, 28}, iota_bytes(10)));
  CHECK_THROWS_WITH(amp_examples::read_idx(cut, kIdxImagesMagic),
                    Contains("truncated: the header promises 1000 x 28 x 28 values"));
}
