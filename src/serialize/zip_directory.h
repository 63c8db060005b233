// The zip layer of amp's strict readers: the central-directory walk and its checks, the
// one-directory layout torch.save and LibTorch give an archive, and reading one entry's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace amp::detail {

/// The most entries a zip archive may have for read_zip_directory, unless the caller says.
constexpr std::size_t kMaxZipEntries = 1024;
/// The longest entry name read_zip_directory accepts, in bytes.
constexpr std::size_t kMaxZipNameLength = 1024;

/// One entry of a zip archive's central directory, checked against its local header.
struct ZipEntry {
  std::string name;
  std::uint64_t record_offset = 0;    ///< where its central directory record starts in the file
  std::uint64_t data_offset = 0;      ///< where the entry's (compressed) bytes start in the file
  std::uint64_t compressed_size = 0;  ///< bytes stored in the file
  std::uint64_t size = 0;             ///< bytes after decompression
  std::uint16_t method = 0;           ///< 0: stored, 8: deflate
  std::uint32_t crc32 = 0;            ///< CRC-32 of the uncompressed bytes, as recorded
};

/// Reads and checks the central directory of the zip archive `file` (the whole file's bytes).
/// Reads ZIP64 archives (over 4 GiB, as torch.save writes them): an end record's ZIP64 markers
/// (0xffff entry counts, 0xffffffff directory size or offset) are replaced by the ZIP64 end
/// record's values, found through its locator, and a central record's (0xffffffff sizes or local
/// header offset, 0xffff disk) by those of its ZIP64 extra field (id 0x0001); a local header's
/// 0xffffffff sizes by its own ZIP64 extra field, or the central record's 64-bit sizes.
/// Checks: the end-of-central-directory record is in the last 64 KiB + 22 bytes and its comment
/// ends the file; a ZIP64 record (which LibTorch's writer adds even to small archives) agrees
/// with the fields the ordinary record does not mark, and markers have a ZIP64 record, a marked
/// central record or local header a ZIP64 extra field long enough; a single disk; 1 to
/// `max_entries` entries, consistent with the directory's size; every central record and local
/// header inside the file, the local header agreeing with the central record (name, method,
/// sizes); names of 1 to kMaxZipNameLength bytes without NUL; no encryption; a stored entry's two
/// sizes equal; every entry's data inside the file, before the central directory. Does not check
/// CRCs or methods (see entry_bytes). A file without an end record that starts like Python's
/// legacy (pre-1.6) torch.save format is refused as such.
/// Throws ReaderError "file byte <offset>: ..." naming the record when a check fails.
std::vector<ZipEntry> read_zip_directory(std::string_view file,
                                         std::size_t max_entries = kMaxZipEntries);

/// A torch.save or LibTorch archive's zip: every entry under one directory `<d>/` (named after
/// the file by torch.save, "archive" by LibTorch), names unique, `<d>/data.pkl` among them.
struct ArchiveDirectory {
  std::vector<ZipEntry> entries;  ///< in central-directory order
  std::string prefix;             ///< "<d>/"
  /// Each entry's index in `entries`, by its name without the prefix ("data.pkl", "data/0").
  std::map<std::string, std::size_t> by_name;
};

/// read_zip_directory, then the layout both torch.save and LibTorch write (ArchiveDirectory).
/// Throws ReaderError naming the entry and its central record when the layout differs.
ArchiveDirectory read_archive_directory(std::string_view file, std::size_t max_entries);

/// The uncompressed bytes of `entry` in `file`, their CRC-32 checked against the record: a view
/// into `file` for a stored entry; for a deflated one (method 8) a view of `inflated`, which
/// receives the inflated bytes. Refuses an entry of more than `limit` bytes before reading it
/// (`kind` says what the entry is in that message: "a state dict's pickle"), any other method,
/// deflated bytes that do not inflate to the recorded size, and a CRC-32 that differs.
std::string_view entry_bytes(std::string_view file, const ZipEntry& entry, std::uint64_t limit,
                             std::string_view kind, std::string& inflated);

/// The CRC-32 (ISO-HDLC, as zip uses) of `bytes`; with `previous`, of the bytes before them
/// (whose CRC-32 it is) followed by `bytes`, so that an entry can be checked piece by piece.
std::uint32_t crc32(std::string_view bytes, std::uint32_t previous = 0);

}  // namespace amp::detail
