// Writes IDX files for tests of the examples' reader: encoding, raw and gzip output.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace amp_test {

inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;

using Bytes = std::vector<std::uint8_t>;

/// The bytes of an IDX file: the magic number and each dimension big-endian, then the values.
/// Written independently of the reader under test so that the two cannot share a mistake.
inline Bytes encode_idx(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                        const Bytes& values) {
  Bytes out;
  const auto append = [&out](std::uint32_t value) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      out.push_back(static_cast<std::uint8_t>(value >> shift));
    }
  };
  append(magic);
  for (std::uint32_t dim : dims) append(dim);
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

/// Writes `bytes` to `path` as they are. Throws std::runtime_error when writing fails.
inline void write_raw(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

/// Writes `bytes` to `path` gzip-compressed. Throws std::runtime_error when writing fails.
inline void write_gzip(const std::filesystem::path& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb9");
  if (file == nullptr) throw std::runtime_error("cannot open " + path.string());
  const int written = gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  if (gzclose(file) != Z_OK || written != static_cast<int>(bytes.size())) {
    throw std::runtime_error("cannot write " + path.string());
  }
}

}  // namespace amp_test
