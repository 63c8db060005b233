// The zip layer: end records, central records checked against local headers, the archive layout
// torch.save and LibTorch share, and entry bytes inflated (zlib) and CRC-checked.
#include "serialize/zip_directory.h"

#include <zlib.h>

#include <algorithm>
#include <utility>

#include "serialize/reader_error.h"

namespace amp::detail {

namespace {

// Record signatures ("PK" and two bytes) and fixed sizes, from the zip specification (APPNOTE).
enum : std::uint32_t {
  kLocalHeaderSignature = 0x04034b50,
  kCentralHeaderSignature = 0x02014b50,
  kEndOfCentralDirSignature = 0x06054b50,
  kZip64EndOfCentralDirSignature = 0x06064b50,
  kZip64LocatorSignature = 0x07064b50,
};
constexpr std::uint64_t kEndOfCentralDirSize = 22, kZip64EndOfCentralDirSize = 56,
                        kZip64LocatorSize = 20, kCentralHeaderSize = 46, kLocalHeaderSize = 30,
                        kMaxZipComment = 0xffff;
// Compression methods.
constexpr std::uint16_t kStored = 0, kDeflated = 8;

// Little-endian reads; callers have checked that the bytes are inside `bytes`.
std::uint64_t read_le(std::string_view bytes, std::uint64_t offset, int width) {
  std::uint64_t value = 0;
  for (int k = width - 1; k >= 0; --k) {
    value =
        (value << 8) | static_cast<unsigned char>(bytes[offset + static_cast<std::uint64_t>(k)]);
  }
  return value;
}
std::uint16_t u16(std::string_view bytes, std::uint64_t offset) {
  return static_cast<std::uint16_t>(read_le(bytes, offset, 2));
}
std::uint32_t u32(std::string_view bytes, std::uint64_t offset) {
  return static_cast<std::uint32_t>(read_le(bytes, offset, 4));
}
std::uint64_t u64(std::string_view bytes, std::uint64_t offset) {
  return read_le(bytes, offset, 8);
}

// Every zip refusal points at a byte of the whole file.
template <typename... Args>
[[noreturn]] void fail_in_file(std::uint64_t offset, const Args&... args) {
  fail_at(kWholeFile, offset, args...);
}

// The end-of-central-directory record: the last one whose comment length reaches exactly the end
// of the file (a comment may itself contain the signature's bytes).
std::uint64_t find_end_of_central_dir(std::string_view file) {
  const std::uint64_t size = file.size();
  if (size < kEndOfCentralDirSize) {
    fail_in_file(0, "the file is ", size, " bytes, too short for a zip archive (at least ",
                 kEndOfCentralDirSize, " bytes)");
  }
  const std::uint64_t lowest = size > kEndOfCentralDirSize + kMaxZipComment
                                   ? size - kEndOfCentralDirSize - kMaxZipComment
                                   : 0;
  for (std::uint64_t at = size - kEndOfCentralDirSize;; --at) {
    if (u32(file, at) == kEndOfCentralDirSignature &&
        at + kEndOfCentralDirSize + u16(file, at + 20) == size) {
      return at;
    }
    if (at == lowest) break;
  }
  fail_in_file(lowest, "no zip end-of-central-directory record in the last ", size - lowest,
               " bytes: the file is not a zip archive, or it is truncated");
}

// LibTorch's writer adds a ZIP64 end record and locator even to small archives. The ordinary
// record is the one read; the ZIP64 one must not say anything different. Returns where the
// central directory must end: the ZIP64 record when there is one, else the ordinary record.
std::uint64_t check_zip64_records(std::string_view file, std::uint64_t eocd, std::uint64_t entries,
                                  std::uint64_t dir_size, std::uint64_t dir_offset) {
  if (eocd < kZip64LocatorSize || u32(file, eocd - kZip64LocatorSize) != kZip64LocatorSignature) {
    return eocd;
  }
  const std::uint64_t locator = eocd - kZip64LocatorSize;
  const std::uint64_t record = u64(file, locator + 8);
  if (u32(file, locator + 4) != 0 || u32(file, locator + 16) != 1) {
    fail_in_file(locator, "the ZIP64 end-of-central-directory locator names another disk; ",
                 "multi-disk archives are not supported");
  }
  if (record > locator || locator - record < kZip64EndOfCentralDirSize) {
    fail_in_file(locator, "the ZIP64 end-of-central-directory locator points to byte ", record,
                 ", which leaves no room for a ZIP64 record before the locator");
  }
  if (u32(file, record) != kZip64EndOfCentralDirSignature) {
    fail_in_file(locator, "the ZIP64 end-of-central-directory locator points to byte ", record,
                 ", where there is no ZIP64 end-of-central-directory record");
  }
  const bool agrees = u32(file, record + 16) == 0 && u32(file, record + 20) == 0 &&
                      u64(file, record + 24) == entries && u64(file, record + 32) == entries &&
                      u64(file, record + 40) == dir_size && u64(file, record + 48) == dir_offset;
  if (!agrees) {
    fail_in_file(record,
                 "the ZIP64 end-of-central-directory record disagrees with the "
                 "end-of-central-directory record at byte ",
                 eocd, " (", u64(file, record + 32), " entries, directory of ",
                 u64(file, record + 40), " bytes at byte ", u64(file, record + 48), " against ",
                 entries, " entries, ", dir_size, " bytes at byte ", dir_offset, ")");
  }
  return record;
}

// The entry's local header must agree with its central record; returns where its data starts.
std::uint64_t check_local_header(std::string_view file, const ZipEntry& entry, std::uint64_t local,
                                 std::uint64_t dir_offset, std::uint16_t flags) {
  const std::string name = quoted(entry.name);
  if (local > dir_offset || dir_offset - local < kLocalHeaderSize) {
    fail_in_file(entry.record_offset, "zip entry ", name, ": its local header at byte ", local,
                 " is not before the central directory (byte ", dir_offset, ")");
  }
  if (u32(file, local) != kLocalHeaderSignature) {
    fail_in_file(local, "zip entry ", name, ": no local header signature here");
  }
  const std::uint64_t name_length = u16(file, local + 26);
  const std::uint64_t extra_length = u16(file, local + 28);
  const std::uint64_t data = local + kLocalHeaderSize + name_length + extra_length;
  if (data > dir_offset) {
    fail_in_file(local, "zip entry ", name,
                 ": its local header runs into the central directory (byte ", dir_offset, ")");
  }
  if (file.substr(local + kLocalHeaderSize, name_length) != entry.name) {
    fail_in_file(local, "zip entry ", name, ": its local header names it ",
                 quoted(file.substr(local + kLocalHeaderSize, name_length)));
  }
  if (u16(file, local + 8) != entry.method) {
    fail_in_file(local, "zip entry ", name, ": its local header gives method ",
                 u16(file, local + 8), " but the central directory gives ", entry.method);
  }
  // With a data descriptor (flag bit 3) the local CRC and sizes may be left 0, as LibTorch's
  // writer leaves them; otherwise they must be the central directory's.
  const std::uint32_t crc = u32(file, local + 14);
  const std::uint32_t compressed = u32(file, local + 18);
  const std::uint32_t size = u32(file, local + 22);
  const bool zero = crc == 0 && compressed == 0 && size == 0;
  const bool same = crc == entry.crc32 && compressed == entry.compressed_size && size == entry.size;
  if (!same && !(zero && (flags & 0x8))) {
    fail_in_file(local, "zip entry ", name, ": its local header gives CRC-32 ", hex(crc, 8),
                 " and sizes ", compressed, "/", size, " but the central directory gives ",
                 hex(entry.crc32, 8), " and ", entry.compressed_size, "/", entry.size);
  }
  if (data + entry.compressed_size > dir_offset) {
    fail_in_file(data, "zip entry ", name, ": its ", entry.compressed_size,
                 " bytes of data run past the start of the central directory (byte ", dir_offset,
                 ")");
  }
  return data;
}

// Central directory record number `k` at `pos`, checked; moves `pos` past it. `dir_end` bounds it.
ZipEntry read_central_record(std::string_view file, std::uint64_t& pos, std::uint32_t k,
                             std::uint64_t dir_offset, std::uint64_t dir_end) {
  if (dir_end - pos < kCentralHeaderSize) {
    fail_in_file(pos, "central directory record ", k,
                 " runs past the end of the central directory (byte ", dir_end, ")");
  }
  if (u32(file, pos) != kCentralHeaderSignature) {
    fail_in_file(pos, "no central directory record signature here (record ", k, ")");
  }
  const std::uint16_t flags = u16(file, pos + 8);
  const std::uint64_t name_length = u16(file, pos + 28);
  const std::uint64_t record_size =
      kCentralHeaderSize + name_length + u16(file, pos + 30) + u16(file, pos + 32);
  if (dir_end - pos < record_size) {
    fail_in_file(pos, "central directory record ", k, " (", record_size,
                 " bytes with its name, extra field and comment) runs past the end of the ",
                 "central directory (byte ", dir_end, ")");
  }
  ZipEntry entry;
  entry.record_offset = pos;
  entry.name = std::string(file.substr(pos + kCentralHeaderSize, name_length));
  if (name_length == 0 || name_length > kMaxZipNameLength ||
      entry.name.find('\0') != std::string::npos) {
    fail_in_file(pos, "central directory record ", k, " has a name of ", name_length, " bytes",
                 name_length == 0 ? "" : " containing NUL or too long", "; entry names are 1 to ",
                 kMaxZipNameLength, " bytes without NUL");
  }
  const std::string name = quoted(entry.name);
  if (flags & 0x41) {
    fail_in_file(pos, "zip entry ", name, " is encrypted (flags ", hex(flags, 4),
                 "); encrypted entries are not supported");
  }
  entry.method = u16(file, pos + 10);
  entry.crc32 = u32(file, pos + 16);
  entry.compressed_size = u32(file, pos + 20);
  entry.size = u32(file, pos + 24);
  const std::uint32_t local = u32(file, pos + 42);
  const std::uint16_t disk = u16(file, pos + 34);
  if (entry.compressed_size == 0xffffffffu || entry.size == 0xffffffffu || local == 0xffffffffu ||
      disk == 0xffff) {
    fail_in_file(pos, "zip entry ", name,
                 " has ZIP64 markers in its central record; ZIP64 archives are not supported");
  }
  if (disk != 0) {
    fail_in_file(pos, "zip entry ", name, " starts on disk ", disk,
                 "; only single-file zips are read");
  }
  if (entry.method == kStored && entry.compressed_size != entry.size) {
    fail_in_file(pos, "zip entry ", name, " is stored but records ", entry.compressed_size,
                 " bytes in the file and ", entry.size, " bytes of content");
  }
  entry.data_offset = check_local_header(file, entry, local, dir_offset, flags);
  pos += record_size;
  return entry;
}

std::string inflate_entry(std::string_view compressed, const ZipEntry& entry) {
  std::string out(static_cast<std::size_t>(entry.size), '\0');
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) {
    fail_in_file(entry.data_offset, "zlib could not start inflating zip entry ",
                 quoted(entry.name));
  }
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  stream.avail_in = static_cast<uInt>(compressed.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  const int status = inflate(&stream, Z_FINISH);
  const std::uint64_t produced = stream.total_out;
  inflateEnd(&stream);
  if (status != Z_STREAM_END || produced != entry.size) {
    fail_in_file(entry.data_offset, "zip entry ", quoted(entry.name), " does not inflate to the ",
                 entry.size, " bytes its record promises (zlib status ", status, " after ",
                 produced, " bytes); its bytes are damaged");
  }
  return out;
}

}  // namespace

std::vector<ZipEntry> read_zip_directory(std::string_view file, std::size_t max_entries) {
  const std::uint64_t eocd = find_end_of_central_dir(file);
  const std::uint16_t disk = u16(file, eocd + 4);
  const std::uint16_t dir_disk = u16(file, eocd + 6);
  const std::uint16_t disk_entries = u16(file, eocd + 8);
  const std::uint16_t entries = u16(file, eocd + 10);
  const std::uint32_t dir_size = u32(file, eocd + 12);
  const std::uint32_t dir_offset = u32(file, eocd + 16);
  if (disk_entries == 0xffff || entries == 0xffff || dir_size == 0xffffffffu ||
      dir_offset == 0xffffffffu) {
    fail_in_file(eocd, "the end-of-central-directory record has ZIP64 markers (entry count ",
                 hex(entries, 4), ", directory size ", hex(dir_size, 8), ", directory offset ",
                 hex(dir_offset, 8), "); ZIP64 archives are not supported");
  }
  if (disk != 0 || dir_disk != 0 || disk_entries != entries) {
    fail_in_file(eocd, "the end-of-central-directory record describes a multi-disk archive (disk ",
                 disk, ", directory on disk ", dir_disk, ", ", disk_entries, " of ", entries,
                 " entries on this disk); only single-file zips are read");
  }
  if (entries == 0) {
    fail_in_file(eocd, "the zip archive has no entries; torch.save and LibTorch write data.pkl ",
                 "and more");
  }
  if (entries > max_entries) {
    fail_in_file(eocd, "the zip archive lists ", entries, " entries; at most ", max_entries,
                 " are accepted");
  }
  const std::uint64_t dir_limit = check_zip64_records(file, eocd, entries, dir_size, dir_offset);
  const std::uint64_t dir_end = std::uint64_t{dir_offset} + dir_size;
  if (dir_end > dir_limit) {
    fail_in_file(dir_offset, "the central directory (", dir_size,
                 " bytes) runs past its end record at byte ", dir_limit);
  }
  if (std::uint64_t{entries} * kCentralHeaderSize > dir_size) {
    fail_in_file(eocd, "the zip archive lists ", entries,
                 " entries, which cannot fit in a central directory of ", dir_size, " bytes");
  }

  std::vector<ZipEntry> result;
  result.reserve(entries);
  std::uint64_t pos = dir_offset;
  for (std::uint32_t k = 0; k < entries; ++k) {
    result.push_back(read_central_record(file, pos, k, dir_offset, dir_end));
  }
  if (pos != dir_end) {
    fail_in_file(pos, "the central directory has ", dir_end - pos, " bytes after its ", entries,
                 " records (it should end here)");
  }
  return result;
}

ArchiveDirectory read_archive_directory(std::string_view file, std::size_t max_entries) {
  ArchiveDirectory archive;
  archive.entries = read_zip_directory(file, max_entries);
  const ZipEntry& first = archive.entries.front();
  const std::size_t slash = first.name.find('/');
  if (slash == std::string::npos || slash == 0) {
    fail_in_file(first.record_offset, "zip entry ", quoted(first.name),
                 " is not inside a directory; torch.save and LibTorch put every entry under one ",
                 "(like 'archive/data.pkl')");
  }
  archive.prefix = first.name.substr(0, slash + 1);
  for (std::size_t k = 0; k < archive.entries.size(); ++k) {
    const ZipEntry& entry = archive.entries[k];
    if (entry.name.compare(0, archive.prefix.size(), archive.prefix) != 0) {
      fail_in_file(entry.record_offset, "zip entry ", quoted(entry.name),
                   " is outside the directory ", quoted(archive.prefix),
                   " that holds the first entry; torch.save and LibTorch put every entry under ",
                   "one directory");
    }
    if (!archive.by_name.emplace(entry.name.substr(archive.prefix.size()), k).second) {
      fail_in_file(entry.record_offset, "zip entry ", quoted(entry.name),
                   " appears twice in the archive");
    }
  }
  if (archive.by_name.count("data.pkl") == 0) {
    fail_in_file(first.record_offset, "the zip archive has no entry ",
                 quoted(archive.prefix + "data.pkl"),
                 "; torch.save and LibTorch always write one, so this file is something else");
  }
  return archive;
}

std::string_view entry_bytes(std::string_view file, const ZipEntry& entry, std::uint64_t limit,
                             std::string_view kind, std::string& inflated) {
  if (entry.size > limit) {
    fail_in_file(entry.record_offset, "zip entry ", quoted(entry.name), " is ", entry.size,
                 " bytes; ", kind, " is at most ", limit, " bytes");
  }
  std::string_view bytes = file.substr(entry.data_offset, entry.compressed_size);
  if (entry.method == kDeflated) {
    inflated = inflate_entry(bytes, entry);
    bytes = inflated;
  } else if (entry.method != kStored) {
    fail_in_file(entry.record_offset, "zip entry ", quoted(entry.name), " uses compression method ",
                 entry.method, "; only stored (0) and deflated (8) entries are read");
  }
  const std::uint32_t crc = crc32(bytes);
  if (crc != entry.crc32) {
    fail_in_file(entry.data_offset, "zip entry ", quoted(entry.name), " has CRC-32 ", hex(crc, 8),
                 " but the archive records ", hex(entry.crc32, 8), "; its bytes are damaged");
  }
  return bytes;
}

std::uint32_t crc32(std::string_view bytes) {
  // zlib's crc32 takes at most 4 GiB (uInt) at a time.
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  while (!bytes.empty()) {
    const std::size_t n = std::min(bytes.size(), kChunk);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace amp::detail
