// ZIP64 in the strict zip reader (src/serialize/zip_directory.cpp): torch.save files over 4 GiB
// use ZIP64's end record and extra fields, modelled here by archives of a few KiB written by the
// test (and by Python's zipfile, made to use ZIP64 for every size); damage to those records is
// refused with a sentence; Python's legacy (pre-1.6) torch.save format is named as such.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "serialize/reader_error.h"
#include "serialize/zip_directory.h"
#include "support/python_rows.h"

using amp::detail::read_zip_directory;
using amp::detail::ZipEntry;
using Catch::Contains;
using namespace std::string_literals;

namespace {

// Appends `value` little-endian in `width` bytes; set_le overwrites bytes at `at`.
void put_le(std::string& out, std::uint64_t value, int width) {
  for (int k = 0; k < width; ++k) out += static_cast<char>((value >> (8 * k)) & 0xff);
}
void set_le(std::string& bytes, std::uint64_t at, std::uint64_t value, int width) {
  for (int k = 0; k < width; ++k) bytes[at + k] = static_cast<char>((value >> (8 * k)) & 0xff);
}

constexpr std::uint64_t kMarker32 = 0xffffffffu;

struct Member {
  std::string name;
  std::string data;
  bool deflated = false;  // method 8, the data in one deflate stored block (5 bytes more)
};

// Three members like a torch.save archive's, of a few KiB; the deflated one makes the two sizes
// differ, so that their order in the ZIP64 extra field matters.
std::vector<Member> members() {
  std::string pattern, pattern2;
  for (int k = 0; k < 3000; ++k) pattern += static_cast<char>((k * 7 + k / 256) & 0xff);
  for (int k = 0; k < 1500; ++k) pattern2 += static_cast<char>((k * 13 + 1) & 0xff);
  return {{"archive/data.pkl", pattern, false},
          {"archive/data/0", pattern2, true},
          {"archive/version", "3\n", false}};
}

// How make_zip writes its archive; by default every field ZIP64 can carry is carried by it.
struct Layout {
  int end_marks = 7;            // in the end record: 1 the entry counts 0xffff, 2 the directory
                                // size 0xffffffff, 4 its offset 0xffffffff
  bool zip64_end = true;        // a ZIP64 end record and locator before the end record
  bool central_sizes = true;    // central records' sizes 0xffffffff, given in their 0x0001 field
  bool central_offsets = true;  // central records' local header offsets likewise
  bool central_field = true;    // false: those markers without the 0x0001 field
  int central_field_cut = 0;    // bytes left off the end of the central 0x0001 field
  std::string central_before;   // extra-field blocks before the central 0x0001 field
  enum class Local {
    kPlain,         // 32-bit sizes and CRC
    kZip64,         // sizes 0xffffffff, given in a 0x0001 field (Python's zipfile, force_zip64)
    kZip64NoField,  // sizes 0xffffffff without a 0x0001 field
    kDescriptor,    // CRC and sizes 0, flag bit 3, a data descriptor after the data (LibTorch)
  } local = Local::kZip64;
  int local_field_cut = 0;  // bytes left off the end of the local 0x0001 field
};

struct Zip {
  std::string bytes;
  std::vector<std::uint64_t> local, data, central;  // where each member's records start
  std::uint64_t directory = 0, directory_size = 0, zip64_end = 0, eocd = 0;
};

std::string stored_block(const std::string& data) {
  std::string out(1, '\x01');  // BFINAL, BTYPE 00 (stored)
  put_le(out, data.size(), 2);
  put_le(out, ~data.size() & 0xffff, 2);
  return out + data;
}

Zip make_zip(const std::vector<Member>& members, const Layout& layout = {}) {
  Zip zip;
  std::string& out = zip.bytes;
  std::vector<std::string> contents;
  for (const Member& m : members) {
    REQUIRE(m.data.size() < 0x10000);
    contents.push_back(m.deflated ? stored_block(m.data) : m.data);
  }
  const bool descriptor = layout.local == Layout::Local::kDescriptor;
  for (std::size_t k = 0; k < members.size(); ++k) {
    const Member& m = members[k];
    const std::uint32_t crc = amp::detail::crc32(m.data);
    std::string extra;
    if (layout.local == Layout::Local::kZip64) {
      std::string field;
      put_le(field, m.data.size(), 8);
      put_le(field, contents[k].size(), 8);
      field.resize(field.size() - static_cast<std::size_t>(layout.local_field_cut));
      put_le(extra, 0x0001, 2);
      put_le(extra, field.size(), 2);
      extra += field;
    }
    zip.local.push_back(out.size());
    put_le(out, 0x04034b50, 4);
    put_le(out, 45, 2);                  // version needed: 4.5, ZIP64
    put_le(out, descriptor ? 8 : 0, 2);  // flags
    put_le(out, m.deflated ? 8 : 0, 2);
    put_le(out, 0, 2);       // time
    put_le(out, 0x0021, 2);  // date: 1980-01-01
    put_le(out, descriptor ? 0 : crc, 4);
    if (layout.local == Layout::Local::kPlain) {
      put_le(out, contents[k].size(), 4);
      put_le(out, m.data.size(), 4);
    } else {
      put_le(out, descriptor ? 0 : kMarker32, 4);
      put_le(out, descriptor ? 0 : kMarker32, 4);
    }
    put_le(out, m.name.size(), 2);
    put_le(out, extra.size(), 2);
    out += m.name + extra;
    zip.data.push_back(out.size());
    out += contents[k];
    if (descriptor) {
      put_le(out, 0x08074b50, 4);
      put_le(out, crc, 4);
      put_le(out, contents[k].size(), 8);
      put_le(out, m.data.size(), 8);
    }
  }
  zip.directory = out.size();
  for (std::size_t k = 0; k < members.size(); ++k) {
    const Member& m = members[k];
    std::string field;
    if (layout.central_sizes) {
      put_le(field, m.data.size(), 8);
      put_le(field, contents[k].size(), 8);
    }
    if (layout.central_offsets) put_le(field, zip.local[k], 8);
    field.resize(field.size() - static_cast<std::size_t>(layout.central_field_cut));
    std::string extra = layout.central_before;
    if (layout.central_field && (layout.central_sizes || layout.central_offsets)) {
      put_le(extra, 0x0001, 2);
      put_le(extra, field.size(), 2);
      extra += field;
    }
    zip.central.push_back(out.size());
    put_le(out, 0x02014b50, 4);
    put_le(out, 45, 2);  // made by
    put_le(out, 45, 2);  // needed
    put_le(out, descriptor ? 8 : 0, 2);
    put_le(out, m.deflated ? 8 : 0, 2);
    put_le(out, 0, 2);
    put_le(out, 0x0021, 2);
    put_le(out, amp::detail::crc32(m.data), 4);
    put_le(out, layout.central_sizes ? kMarker32 : contents[k].size(), 4);
    put_le(out, layout.central_sizes ? kMarker32 : m.data.size(), 4);
    put_le(out, m.name.size(), 2);
    put_le(out, extra.size(), 2);
    put_le(out, 0, 2);  // comment
    put_le(out, 0, 2);  // disk
    put_le(out, 0, 2);  // internal attributes
    put_le(out, 0, 4);  // external attributes
    put_le(out, layout.central_offsets ? kMarker32 : zip.local[k], 4);
    out += m.name + extra;
  }
  zip.directory_size = out.size() - zip.directory;
  const std::uint64_t count = members.size();
  if (layout.zip64_end) {
    zip.zip64_end = out.size();
    put_le(out, 0x06064b50, 4);
    put_le(out, 44, 8);  // the record's size after this field
    put_le(out, 45, 2);
    put_le(out, 45, 2);
    put_le(out, 0, 4);
    put_le(out, 0, 4);
    put_le(out, count, 8);
    put_le(out, count, 8);
    put_le(out, zip.directory_size, 8);
    put_le(out, zip.directory, 8);
    put_le(out, 0x07064b50, 4);  // the locator
    put_le(out, 0, 4);
    put_le(out, zip.zip64_end, 8);
    put_le(out, 1, 4);
  }
  zip.eocd = out.size();
  put_le(out, 0x06054b50, 4);
  put_le(out, 0, 2);
  put_le(out, 0, 2);
  for (int k = 0; k < 2; ++k) put_le(out, (layout.end_marks & 1) ? 0xffff : count, 2);
  put_le(out, (layout.end_marks & 2) ? kMarker32 : zip.directory_size, 4);
  put_le(out, (layout.end_marks & 4) ? kMarker32 : zip.directory, 4);
  put_le(out, 0, 2);
  return zip;
}

// The bytes of `entry`, inflated and CRC-checked by the reader.
std::string bytes_of(const std::string& file, const ZipEntry& entry) {
  std::string inflated;
  return std::string(amp::detail::entry_bytes(file, entry, 1 << 20, "a test entry", inflated));
}

// What read_zip_directory says refusing `file` ("" when it reads it).
std::string refusal(const std::string& file) {
  try {
    read_zip_directory(file);
  } catch (const amp::detail::ReaderError& error) {
    return error.what();
  }
  return "";
}

std::string at_byte(std::uint64_t offset) { return "file byte " + std::to_string(offset) + ": "; }

// Checks that `entries` are `expected` as make_zip wrote them into `zip`.
void check_entries(const Zip& zip, const std::vector<ZipEntry>& entries,
                   const std::vector<Member>& expected) {
  REQUIRE(entries.size() == expected.size());
  for (std::size_t k = 0; k < entries.size(); ++k) {
    CAPTURE(k);
    const ZipEntry& entry = entries[k];
    const Member& m = expected[k];
    CHECK(entry.name == m.name);
    CHECK(entry.record_offset == zip.central[k]);
    CHECK(entry.data_offset == zip.data[k]);
    CHECK(entry.size == m.data.size());
    CHECK(entry.compressed_size == m.data.size() + (m.deflated ? 5 : 0));
    CHECK(entry.method == (m.deflated ? 8 : 0));
    CHECK(entry.crc32 == amp::detail::crc32(m.data));
    CHECK(bytes_of(zip.bytes, entry) == m.data);
  }
}

// A file in the temporary folder, removed when it goes.
struct TempFile {
  explicit TempFile(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("amp_zip64_" + std::to_string(::getpid()) + "_" + name)) {}
  ~TempFile() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  std::filesystem::path path;
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("A ZIP64 archive is read through its ZIP64 end record and extra fields",
          "[serialize][zip][zip64]") {
  const std::vector<Member> expected = members();
  Layout layout;
  SECTION("local headers with ZIP64 extra fields, as Python's zipfile writes them") {}
  SECTION("local headers with zeros and a data descriptor, as LibTorch's writer leaves them") {
    layout.local = Layout::Local::kDescriptor;
  }
  SECTION("local headers with 32-bit sizes") { layout.local = Layout::Local::kPlain; }
  SECTION("local headers with ZIP64 markers, the sizes only in the central records") {
    layout.local = Layout::Local::kZip64NoField;
  }
  SECTION("other extra-field blocks before the ZIP64 one") {
    layout.central_before = std::string("UT\x05\x00\x01\x00\x00\x00\x00", 9) + "xy\x00\x00"s;
  }
  SECTION("only the end record's entry count marked") { layout.end_marks = 1; }
  SECTION("only the end record's directory offset marked, the central records' offsets only") {
    layout.end_marks = 4;
    layout.central_sizes = false;
  }
  SECTION("no end-record markers, the central records' sizes only") {
    layout.end_marks = 0;
    layout.central_offsets = false;
  }
  const Zip zip = make_zip(expected, layout);
  const std::vector<ZipEntry> entries = read_zip_directory(zip.bytes);
  check_entries(zip, entries, expected);
  const amp::detail::ArchiveDirectory archive = amp::detail::read_archive_directory(zip.bytes, 8);
  CHECK(archive.prefix == "archive/");
  CHECK(archive.by_name.count("data.pkl") == 1);
}

TEST_CASE("ZIP64 end-record markers need a ZIP64 end record that agrees and fits",
          "[serialize][zip][zip64][refuse]") {
  Layout layout;
  SECTION("markers without a ZIP64 end record") {
    layout.zip64_end = false;
    const Zip zip = make_zip(members(), layout);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.eocd) +
                        "the end-of-central-directory record has ZIP64 markers (entry count "
                        "0xffff, directory size 0xffffffff, directory offset 0xffffffff) but no "
                        "ZIP64 end-of-central-directory locator before it"));
  }
  SECTION("a field not marked that disagrees with the ZIP64 record") {
    layout.end_marks = 1;
    Zip zip = make_zip(members(), layout);
    set_le(zip.bytes, zip.zip64_end + 40, zip.directory_size + 46, 8);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.zip64_end) +
                        "the ZIP64 end-of-central-directory record disagrees with the "
                        "end-of-central-directory record at byte " +
                        std::to_string(zip.eocd)));
  }
  SECTION("a marked directory offset past the ZIP64 record") {
    Zip zip = make_zip(members());
    set_le(zip.bytes, zip.zip64_end + 48, std::uint64_t{1} << 40, 8);
    CHECK_THAT(
        refusal(zip.bytes),
        Contains(at_byte(std::uint64_t{1} << 40) + "the central directory (" +
                 std::to_string(zip.directory_size) + " bytes) runs past its end record at byte " +
                 std::to_string(zip.zip64_end)));
  }
  SECTION("a marked directory size that wraps around") {
    Zip zip = make_zip(members());
    set_le(zip.bytes, zip.zip64_end + 40, ~std::uint64_t{0} - 10, 8);
    CHECK_THAT(refusal(zip.bytes), Contains("bytes) runs past its end record at byte " +
                                            std::to_string(zip.zip64_end)));
  }
  SECTION("a marked entry count over the limit") {
    Zip zip = make_zip(members());
    set_le(zip.bytes, zip.zip64_end + 24, std::uint64_t{1} << 33, 8);
    set_le(zip.bytes, zip.zip64_end + 32, std::uint64_t{1} << 33, 8);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.eocd) + "the zip archive lists 8589934592 entries; at most "
                                            "1024 are accepted"));
  }
  SECTION("marked entry counts that differ (another disk)") {
    Zip zip = make_zip(members());
    set_le(zip.bytes, zip.zip64_end + 24, 2, 8);
    CHECK_THAT(refusal(zip.bytes), Contains("describes a multi-disk archive (disk 0, directory on "
                                            "disk 0, 2 of 3 entries on this disk)"));
  }
  SECTION("a locator that points to no ZIP64 record") {
    Zip zip = make_zip(members());
    set_le(zip.bytes, zip.eocd - 20 + 8, 0, 8);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.eocd - 20) +
                        "the ZIP64 end-of-central-directory locator points to byte 0, where there "
                        "is no ZIP64 end-of-central-directory record"));
  }
}

TEST_CASE("A central record with ZIP64 markers and no ZIP64 extra field is refused",
          "[serialize][zip][zip64][refuse]") {
  Layout layout;
  layout.end_marks = 0;
  layout.zip64_end = false;
  layout.central_field = false;
  layout.local = Layout::Local::kPlain;
  SECTION("no extra field") {}
  SECTION("other extra-field blocks only") { layout.central_before = "xy\x02\x00"s + "ab"; }
  const Zip zip = make_zip(members(), layout);
  CHECK_THAT(refusal(zip.bytes),
             Contains(at_byte(zip.central[0]) +
                      "zip entry 'archive/data.pkl' has ZIP64 markers in its central record (size, "
                      "compressed size, local header offset) but no ZIP64 extended information "
                      "extra field (0x0001) to give their 64-bit values"));
}

TEST_CASE("A short or overrunning ZIP64 extra field is refused",
          "[serialize][zip][zip64][refuse]") {
  Layout layout;
  SECTION("a central 0x0001 field one byte short") {
    layout.central_field_cut = 1;
    const Zip zip = make_zip(members(), layout);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.central[0] + 46 + 16) +
                        "zip entry 'archive/data.pkl': the ZIP64 extended information extra field "
                        "(0x0001) of its central record is 23 bytes, too short for the 24 bytes of "
                        "the fields its markers name (size, compressed size, local header "
                        "offset)"));
  }
  SECTION("a central 0x0001 field without the offset") {
    layout.central_field_cut = 8;
    CHECK_THAT(refusal(make_zip(members(), layout).bytes),
               Contains("of its central record is 16 bytes, too short for the 24 bytes"));
  }
  SECTION("a block before it that runs past the extra field") {
    layout.central_before = "xy\xff\x00"s;
    const Zip zip = make_zip(members(), layout);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.central[0] + 46 + 16) +
                        "zip entry 'archive/data.pkl': the extra field of its central record has a "
                        "block 0x7978 of 255 bytes, which runs past the extra field's end (28 "
                        "bytes left)"));
  }
  SECTION("a local 0x0001 field without the compressed size") {
    layout.local_field_cut = 8;
    const Zip zip = make_zip(members(), layout);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.local[0] + 30 + 16) +
                        "zip entry 'archive/data.pkl': the ZIP64 extended information extra field "
                        "(0x0001) of its local header is 8 bytes, too short for the 16 bytes of "
                        "the fields its markers name (size, compressed size)"));
  }
}

TEST_CASE("A local header must agree with its central record through ZIP64 too",
          "[serialize][zip][zip64][refuse]") {
  const std::vector<Member> expected = members();
  SECTION("a local ZIP64 size that differs") {
    Zip zip = make_zip(expected);
    // The local 0x0001 field's data: size, then compressed size.
    set_le(zip.bytes, zip.local[0] + 30 + 16 + 4, 3001, 8);
    CHECK_THAT(refusal(zip.bytes),
               Contains(at_byte(zip.local[0]) +
                        "zip entry 'archive/data.pkl': its local header gives CRC-32 " +
                        amp::detail::hex(amp::detail::crc32(expected[0].data), 8) +
                        " and sizes 3000/3001 but the central directory gives"));
  }
  SECTION("local markers without a field when the central record has 32-bit sizes") {
    Layout layout;
    layout.local = Layout::Local::kZip64NoField;
    layout.central_sizes = false;
    CHECK_THAT(refusal(make_zip(expected, layout).bytes),
               Contains("its local header gives CRC-32 " +
                        amp::detail::hex(amp::detail::crc32(expected[0].data), 8) +
                        " and sizes 4294967295/4294967295 but the central directory gives"));
  }
}

TEST_CASE("A file in PyTorch's legacy format is named as such, other files are not zips",
          "[serialize][zip][legacy]") {
  // Python's legacy torch.save starts with the pickle of its magic number 0x1950a86a20f9469cfc6c
  // (PROTO 2, LONG1 of 10 bytes), then STOP and the pickle of its protocol version, 1001.
  const std::string magic("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14);
  const std::string legacy = magic + ".\x80\x02M\xe9\x03." + std::string(400, 'x');
  CHECK(refusal(legacy) ==
        "file byte 0: the file is a PyTorch file in the legacy (pre-1.6) format, which amp does "
        "not read; re-save it in Python with torch.save(torch.load(path), path)");
  // Another number, or the magic elsewhere, is just not a zip archive.
  std::string other = legacy;
  other[13] = '\x18';
  CHECK_THAT(refusal(other), Contains("file byte 0: no zip end-of-central-directory record in the "
                                      "last 421 bytes: the file is not a zip archive, or it is "
                                      "truncated"));
  CHECK_THAT(refusal("x" + legacy), Contains("not a zip archive, or it is truncated"));
  CHECK_THAT(refusal(std::string(100, 'z')), Contains("not a zip archive, or it is truncated"));
  CHECK_THAT(refusal(magic), Contains("too short for a zip archive"));
}

TEST_CASE("Python's zipfile and the reader agree on ZIP64 archives", "[serialize][zip][zip64]") {
#ifndef AMP_TEST_PYTHON
  WARN("AMP_TEST_PYTHON is not defined: no cross-check against Python's zipfile");
#else
  const std::string python = AMP_TEST_PYTHON;
  REQUIRE(std::filesystem::exists(python));
  // "write PATH" writes a ZIP64 archive with zipfile (ZIP64_LIMIT lowered, so that every size and
  // offset but 0 uses ZIP64's fields; force_zip64); then, as "read PATH" alone does, reads PATH
  // back and prints a row per entry: name, local header offset, size, compressed size, CRC-32
  // and the bytes in hex.
  TempFile script("zip64.py");
  std::ofstream(script.path) << R"(import sys, zipfile
mode, path = sys.argv[1], sys.argv[2]
if mode == 'write':
    limit, zipfile.ZIP64_LIMIT = zipfile.ZIP64_LIMIT, 1
    with zipfile.ZipFile(path, 'w') as z:
        with z.open('archive/data.pkl', 'w', force_zip64=True) as f:
            f.write(bytes(range(256)) * 9)
        z.writestr('archive/data/0', bytes(range(7, 250)) * 10, zipfile.ZIP_DEFLATED)
        z.writestr('archive/version', b'3\n')
    zipfile.ZIP64_LIMIT = limit
with zipfile.ZipFile(path) as z:
    assert z.testzip() is None
    for i in z.infolist():
        print(i.filename, i.header_offset, i.file_size, i.compress_size, i.CRC, z.read(i).hex(),
              sep='\t')
)";
  const auto rows = [&](const std::string& mode, const std::filesystem::path& path) {
    const auto result =
        amp_test::python_rows(python, script.path.string(), mode + " \"" + path.string() + "\"");
    for (const auto& fields : result) REQUIRE(fields.size() == 6);
    return result;
  };
  const auto hex_of = [](const std::string& bytes) {
    std::string out;
    for (unsigned char c : bytes) out += amp::detail::hex(c, 2).substr(2);
    return out;
  };

  SECTION("what Python writes") {
    TempFile zip_file("python.zip");
    const auto python_rows = rows("write", zip_file.path);
    std::string file = read_file(zip_file.path);
    // Python wrote ZIP64's records: a ZIP64 end record and locator, and markers in the central
    // records. Python leaves the end record's fields unmarked when they fit: mark them.
    const std::uint64_t eocd = file.size() - 22;
    REQUIRE(file.compare(eocd - 20 - 56, 4, "PK\x06\x06") == 0);
    set_le(file, eocd + 8, 0xffff, 2);
    set_le(file, eocd + 10, 0xffff, 2);
    set_le(file, eocd + 12, kMarker32, 4);
    set_le(file, eocd + 16, kMarker32, 4);
    const std::vector<ZipEntry> entries = read_zip_directory(file);
    REQUIRE(entries.size() == python_rows.size());
    REQUIRE(entries.size() == 3);
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const ZipEntry& entry = entries[k];
      const auto& row = python_rows[k];
      CAPTURE(k, row[0]);
      CHECK(file.compare(entry.record_offset + 20, 8, std::string(8, '\xff')) == 0);
      CHECK(entry.name == row[0]);
      CHECK(file.compare(entry.data_offset - 30 - entry.name.size() - 20, 4, "PK\x03\x04") == 0);
      CHECK(entry.size == std::stoull(row[2]));
      CHECK(entry.compressed_size == std::stoull(row[3]));
      CHECK(entry.crc32 == std::stoull(row[4]));
      CHECK(hex_of(bytes_of(file, entry)) == row[5]);
    }
    CHECK(entries[1].method == 8);
    CHECK(entries[1].compressed_size < entries[1].size);
  }
  SECTION("what the test writes") {
    const std::vector<Member> expected = members();
    Layout layout;
    SECTION("ZIP64 local headers") {}
    SECTION("data descriptors") { layout.local = Layout::Local::kDescriptor; }
    const Zip zip = make_zip(expected, layout);
    check_entries(zip, read_zip_directory(zip.bytes), expected);
    TempFile zip_file("amp.zip");
    std::ofstream(zip_file.path, std::ios::binary) << zip.bytes;
    const auto python_rows = rows("read", zip_file.path);
    REQUIRE(python_rows.size() == expected.size());
    for (std::size_t k = 0; k < expected.size(); ++k) {
      const auto& row = python_rows[k];
      CAPTURE(k);
      CHECK(row[0] == expected[k].name);
      CHECK(std::stoull(row[1]) == zip.local[k]);
      CHECK(std::stoull(row[2]) == expected[k].data.size());
      CHECK(row[5] == hex_of(expected[k].data));
    }
  }
#endif
}
