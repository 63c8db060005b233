// The zip layer: end records, central records checked against local headers, the archive layout
// torch.save and LibTorch share, and entry bytes inflated (zlib) and CRC-checked.
#include "serialize/zip_directory.h"

#include <zlib.h>

#include <algorithm>
#include <initializer_list>
#include <string>
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
  // Python's legacy torch.save (before 1.6, or _use_new_zipfile_serialization=False) starts with
  // a pickle of its magic number: PROTO 2, LONG1 of 10 bytes, 0x1950a86a20f9469cfc6c.
  static constexpr char kLegacyMagic[] = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
  if (file.substr(0, sizeof kLegacyMagic - 1) ==
      std::string_view(kLegacyMagic, sizeof kLegacyMagic - 1)) {
    fail_in_file(0,
                 "the file is a PyTorch file in the legacy (pre-1.6) format, which amp does not ",
                 "read; re-save it in Python with torch.save(torch.load(path), path)");
  }
  fail_in_file(lowest, "no zip end-of-central-directory record in the last ", size - lowest,
               " bytes: the file is not a zip archive, or it is truncated");
}

// The ZIP64 end-of-central-directory record named by the locator just before the ordinary end
// record at `eocd`, the locator checked; `eocd` itself when there is no locator.
std::uint64_t find_zip64_record(std::string_view file, std::uint64_t eocd) {
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
  return record;
}

// LibTorch's writer adds a ZIP64 end record and locator even to small archives; an archive over
// 4 GiB needs them. The values given (the ordinary record's, those it marks taken from the ZIP64
// record) must be the ZIP64 record's. Returns where the central directory must end: the ZIP64
// record when there is one, else the ordinary record.
std::uint64_t check_zip64_records(std::string_view file, std::uint64_t eocd, std::uint64_t entries,
                                  std::uint64_t dir_size, std::uint64_t dir_offset) {
  const std::uint64_t record = find_zip64_record(file, eocd);
  if (record == eocd) return eocd;
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

// A field of a central record or local header that may hold a ZIP64 marker (0xffffffff, or 0xffff
// for the disk), its 64-bit value then in the ZIP64 extended information extra field.
struct Zip64Field {
  const char* what;  // "size", as refusals name it
  int width;         // its bytes in the ZIP64 extra field
  bool marked;
  std::uint64_t* value;
};

// Replaces each marked field's value by its value in the ZIP64 extended information extra field
// (id 0x0001) of the extra field of `length` bytes at `extra`, which holds the marked fields only,
// in the order of `fields`. `record` (where the central record or local header starts) and
// `where` ("central record", "local header") name what is refused. Returns false when there is no
// such field and it is not `required` (else refused), the values then left as they are.
bool read_zip64_fields(std::string_view file, std::uint64_t record, std::uint64_t extra,
                       std::uint64_t length, const std::string& name, const char* where,
                       bool required, std::initializer_list<Zip64Field> fields) {
  std::string marked;
  std::uint64_t needed = 0;
  for (const Zip64Field& field : fields) {
    if (!field.marked) continue;
    marked += (marked.empty() ? "" : ", ") + std::string(field.what);
    needed += static_cast<std::uint64_t>(field.width);
  }
  if (needed == 0) return true;
  // The extra field is (id, length, data) blocks; find the one with id 0x0001.
  std::uint64_t at = extra;
  const std::uint64_t end = extra + length;
  for (;;) {
    if (at == end) {
      if (!required) return false;
      fail_in_file(record, "zip entry ", name, " has ZIP64 markers in its ", where, " (", marked,
                   ") but no ZIP64 extended information extra field (0x0001) to give their ",
                   "64-bit values");
    }
    if (end - at < 4) {
      fail_in_file(at, "zip entry ", name, ": the extra field of its ", where, " ends with ",
                   end - at, " bytes, too few for a block's id and length (4 bytes)");
    }
    const std::uint16_t id = u16(file, at);
    const std::uint64_t size = u16(file, at + 2);
    if (size > end - at - 4) {
      fail_in_file(at, "zip entry ", name, ": the extra field of its ", where, " has a block ",
                   hex(id, 4), " of ", size, " bytes, which runs past the extra field's end (",
                   end - at - 4, " bytes left)");
    }
    if (id == 0x0001) {
      if (size < needed) {
        fail_in_file(at, "zip entry ", name,
                     ": the ZIP64 extended information extra field (0x0001) of its ", where, " is ",
                     size, " bytes, too short for the ", needed, " bytes of the fields its ",
                     "markers name (", marked, ")");
      }
      break;
    }
    at += 4 + size;
  }
  std::uint64_t data = at + 4;
  for (const Zip64Field& field : fields) {
    if (!field.marked) continue;
    *field.value = read_le(file, data, field.width);
    data += static_cast<std::uint64_t>(field.width);
  }
  return true;
}

// The entry's local header must agree with its central record; returns where its data starts.
// `zip64_compressed` and `zip64_size` say which sizes the central record gave in its ZIP64 field.
std::uint64_t check_local_header(std::string_view file, const ZipEntry& entry, std::uint64_t local,
                                 std::uint64_t dir_offset, std::uint16_t flags,
                                 bool zip64_compressed, bool zip64_size) {
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
  // writer leaves them; otherwise they must be the central directory's. A size of 0xffffffff is a
  // ZIP64 marker: the local header's ZIP64 extra field gives the 64-bit size (as Python's zipfile
  // writes it), or without one it is the central record's when that gives it through ZIP64 too.
  const std::uint32_t crc = u32(file, local + 14);
  std::uint64_t compressed = u32(file, local + 18);
  std::uint64_t size = u32(file, local + 22);
  const bool compressed_marked = compressed == 0xffffffffu;
  const bool size_marked = size == 0xffffffffu;
  if (compressed_marked || size_marked) {
    const std::uint64_t extra = local + kLocalHeaderSize + name_length;
    if (!read_zip64_fields(file, local, extra, extra_length, name, "local header", false,
                           {{"size", 8, size_marked, &size},
                            {"compressed size", 8, compressed_marked, &compressed}})) {
      if (compressed_marked && zip64_compressed) compressed = entry.compressed_size;
      if (size_marked && zip64_size) size = entry.size;
    }
  }
  const bool zero = crc == 0 && compressed == 0 && size == 0;
  const bool same = crc == entry.crc32 && compressed == entry.compressed_size && size == entry.size;
  if (!same && !(zero && (flags & 0x8))) {
    fail_in_file(local, "zip entry ", name, ": its local header gives CRC-32 ", hex(crc, 8),
                 " and sizes ", compressed, "/", size, " but the central directory gives ",
                 hex(entry.crc32, 8), " and ", entry.compressed_size, "/", entry.size);
  }
  if (entry.compressed_size > dir_offset - data) {
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
  std::uint64_t local = u32(file, pos + 42);
  std::uint64_t disk = u16(file, pos + 34);
  const bool zip64_compressed = entry.compressed_size == 0xffffffffu;
  const bool zip64_size = entry.size == 0xffffffffu;
  // ZIP64 markers: the 64-bit values are in the record's ZIP64 extra field.
  read_zip64_fields(file, pos, pos + kCentralHeaderSize + name_length, u16(file, pos + 30), name,
                    "central record", true,
                    {{"size", 8, zip64_size, &entry.size},
                     {"compressed size", 8, zip64_compressed, &entry.compressed_size},
                     {"local header offset", 8, local == 0xffffffffu, &local},
                     {"disk", 4, disk == 0xffff, &disk}});
  if (disk != 0) {
    fail_in_file(pos, "zip entry ", name, " starts on disk ", disk,
                 "; only single-file zips are read");
  }
  if (entry.method == kStored && entry.compressed_size != entry.size) {
    fail_in_file(pos, "zip entry ", name, " is stored but records ", entry.compressed_size,
                 " bytes in the file and ", entry.size, " bytes of content");
  }
  entry.data_offset =
      check_local_header(file, entry, local, dir_offset, flags, zip64_compressed, zip64_size);
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
  // zlib takes at most 4 GiB (uInt) of input and of output a call: a ZIP64 entry is fed in parts.
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 30;
  std::uint64_t in_left = compressed.size(), out_left = out.size();
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  int status = Z_OK;
  while (status == Z_OK) {
    if (stream.avail_in == 0) {
      stream.avail_in = static_cast<uInt>(std::min(in_left, kChunk));
      in_left -= stream.avail_in;
    }
    if (stream.avail_out == 0) {
      stream.avail_out = static_cast<uInt>(std::min(out_left, kChunk));
      out_left -= stream.avail_out;
    }
    // Z_BUF_ERROR once no input or no room is left: the bytes end before the stream does.
    status = inflate(&stream, Z_NO_FLUSH);
  }
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
  const std::uint64_t disk = u16(file, eocd + 4);
  const std::uint64_t dir_disk = u16(file, eocd + 6);
  std::uint64_t disk_entries = u16(file, eocd + 8);
  std::uint64_t entries = u16(file, eocd + 10);
  std::uint64_t dir_size = u32(file, eocd + 12);
  std::uint64_t dir_offset = u32(file, eocd + 16);
  // ZIP64 markers: the values are the ZIP64 end record's (check_zip64_records then checks that the
  // fields not marked agree with it).
  if (disk_entries == 0xffff || entries == 0xffff || dir_size == 0xffffffffu ||
      dir_offset == 0xffffffffu) {
    const std::uint64_t record = find_zip64_record(file, eocd);
    if (record == eocd) {
      fail_in_file(eocd, "the end-of-central-directory record has ZIP64 markers (entry count ",
                   hex(entries, 4), ", directory size ", hex(dir_size, 8), ", directory offset ",
                   hex(dir_offset, 8), ") but no ZIP64 end-of-central-directory locator before ",
                   "it; the archive is damaged or truncated");
    }
    if (disk_entries == 0xffff) disk_entries = u64(file, record + 24);
    if (entries == 0xffff) entries = u64(file, record + 32);
    if (dir_size == 0xffffffffu) dir_size = u64(file, record + 40);
    if (dir_offset == 0xffffffffu) dir_offset = u64(file, record + 48);
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
  if (dir_offset > dir_limit || dir_size > dir_limit - dir_offset) {
    fail_in_file(dir_offset, "the central directory (", dir_size,
                 " bytes) runs past its end record at byte ", dir_limit);
  }
  const std::uint64_t dir_end = dir_offset + dir_size;
  if (entries * kCentralHeaderSize > dir_size) {
    fail_in_file(eocd, "the zip archive lists ", entries,
                 " entries, which cannot fit in a central directory of ", dir_size, " bytes");
  }

  std::vector<ZipEntry> result;
  result.reserve(static_cast<std::size_t>(entries));
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

std::uint32_t crc32(std::string_view bytes, std::uint32_t previous) {
  // zlib's crc32 takes at most 4 GiB (uInt) at a time.
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  uLong crc = previous;
  while (!bytes.empty()) {
    const std::size_t n = std::min(bytes.size(), kChunk);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace amp::detail
