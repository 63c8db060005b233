// Edits the content of one stored zip entry in a test's copy of a file and fixes its CRC-32, so
// that the archive checks see only the content as wrong (archive.tests.cpp, state_dict.tests.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "serialize/zip_directory.h"

namespace amp_test {

inline void put_le32(std::string& bytes, std::uint64_t offset, std::uint32_t value) {
  for (int k = 0; k < 4; ++k) bytes[offset + k] = static_cast<char>((value >> (8 * k)) & 0xff);
}

// Replaces `from` by `to` (same length) in the first stored entry ending in `entry_suffix` that
// contains it, and fixes the entry's CRC-32 in both headers, so that only the content is wrong.
inline std::string edit_entry(std::string file, const std::string& entry_suffix,
                              const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  for (const auto& entry : amp::detail::read_zip_directory(file, 0xfffe)) {
    if (entry.name.size() < entry_suffix.size() ||
        entry.name.compare(entry.name.size() - entry_suffix.size(), entry_suffix.size(),
                           entry_suffix) != 0) {
      continue;
    }
    std::string content = file.substr(entry.data_offset, entry.size);
    const auto at = content.find(from);
    if (entry.method != 0 || at == std::string::npos) continue;
    content.replace(at, from.size(), to);
    file.replace(entry.data_offset, entry.size, content);
    const std::uint32_t crc = amp::detail::crc32(content);
    // The central record holds the CRC at +16 and its local header's offset at +42. LibTorch's
    // writer leaves the local header's CRC and sizes 0 (a data descriptor follows the data), so
    // only a local header that records a CRC (at +14) gets the new one. The local header cannot
    // be found by counting back from the data: an extra field of name-dependent length pads it.
    const std::size_t central = entry.record_offset;
    const auto le32 = [&file](std::size_t at) {
      std::uint32_t value = 0;
      for (int k = 0; k < 4; ++k) {
        value |= static_cast<std::uint32_t>(static_cast<unsigned char>(file[at + k])) << (8 * k);
      }
      return value;
    };
    const std::uint32_t local = le32(central + 42);
    if (le32(local + 14) != 0) put_le32(file, local + 14, crc);
    put_le32(file, central + 16, crc);
    return file;
  }
  FAIL("no stored entry ending in " << entry_suffix << " contains " << from);
  return file;
}

}  // namespace amp_test
