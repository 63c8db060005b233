// The archive checker's entry point: the zip layout of an archive, each entry's method and size,
// then its pickles and code through the pickle and code parts (archive_check.h).
#include "serialize/archive_check.h"

#include <algorithm>
#include <string>

#include "serialize/archive_text.h"
#include "serialize/zip_directory.h"

namespace amp::detail {

using archive_text::ends_with;
using archive_text::starts_with;

ArchiveDirectory check_archive(std::string_view file) {
  ArchiveDirectory archive = read_archive_directory(file, 0xfffe);
  for (const ZipEntry& entry : archive.entries) {
    if (entry.method != 0 && entry.method != 8) {
      fail_at(kWholeFile, entry.record_offset, "zip entry ", quoted(entry.name),
              " uses compression method ", entry.method,
              "; LibTorch's archives are stored (0) or deflated (8)");
    }
  }
  const ArchiveRecordSize record_size = [&](std::string_view name) -> std::optional<std::uint64_t> {
    const auto it = archive.by_name.find(std::string(name));
    if (it == archive.by_name.end() || archive.entries[it->second].method != 0) return std::nullopt;
    return archive.entries[it->second].size;
  };
  std::string inflated;  // a deflated entry's bytes, reused from entry to entry
  for (const auto& [name, index] : archive.by_name) {
    const ZipEntry& entry = archive.entries[index];
    const auto refuse_entry = [&](const char* why) {
      fail_at(kWholeFile, entry.record_offset, "zip entry ", quoted(entry.name), " ", why);
    };
    if (ends_with(name, ".pkl") || ends_with(name, ".debug_pkl")) {
      if (entry.method != 0) refuse_entry("is compressed; LibTorch stores pickles as they are");
      check_archive_pickle(
          entry_bytes(file, entry, kMaxArchivePickleSize, "an archive's pickle", inflated),
          entry.name, record_size);
    } else if (starts_with(name, "code/")) {
      if (!ends_with(name, ".py")) refuse_entry("in code/ is not a .py file or its debug_pkl");
      check_archive_code(
          entry_bytes(file, entry, kMaxArchiveCodeSize, "an archive's code file", inflated),
          entry.name);
    } else if (starts_with(name, "data/") || starts_with(name, "constants/")) {
      if (entry.method != 0) {
        refuse_entry("holds tensor data but is compressed; LibTorch stores tensor data as it is");
      }
    } else if (name == "version" || name == ".data/version") {
      const std::string_view text =
          entry_bytes(file, entry, kMaxArchiveRecordSize, "an archive's record", inflated);
      std::string_view digits = text;
      if (!digits.empty() && digits.back() == '\n') digits.remove_suffix(1);
      if (digits.empty() || digits.size() > 4 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        fail_at(kWholeFile, entry.data_offset, "zip entry ", quoted(entry.name), " is ",
                quoted(text), " rather than a format version number");
      }
    } else {
      // byteorder, .data/serialization_id, extra/...: LibTorch reads them whole.
      entry_bytes(file, entry, kMaxArchiveRecordSize, "an archive's record", inflated);
    }
  }
  return archive;
}

}  // namespace amp::detail
