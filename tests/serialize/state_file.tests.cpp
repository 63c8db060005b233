// The strict state-file reader (src/serialize/state_file.cpp): what torch.save and amp write is
// read exactly; damaged and hostile files are refused with a sentence, never crash or hang.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <amp/grad_scaler.h>

#include "serialize/state_file.h"
#include "serialize/zip_directory.h"
#include "support/python_rows.h"

using amp::detail::parse_state_file;
using amp::detail::parse_state_pickle;
using amp::detail::StateEntries;
using amp::detail::StateValue;
using Catch::Contains;

namespace {

const std::string kCorpus = AMP_TEST_SOURCE_DIR "/fuzz/corpus/state_file";
const std::string kCorpusScript = AMP_TEST_SOURCE_DIR "/fuzz/make_state_file_corpus.py";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Lines printed by the venv's Python (torch.load / zipfile: the reference), split at tabs.
std::vector<std::vector<std::string>> python_rows(const std::string& args) {
  return amp_test::python_rows(AMP_TEST_PYTHON, kCorpusScript, args);
}

// Checks `value` against Python's "float|int|bool" and its text (float.hex(), int, True/False).
void check_value(const StateValue& value, const std::string& kind, const std::string& text) {
  if (kind == "float") {
    REQUIRE(value.kind == StateValue::Kind::kFloat);
    const double expected = std::strtod(text.c_str(), nullptr);
    if (std::isnan(expected)) {
      CHECK(std::isnan(value.f));
    } else {
      CHECK(value.f == expected);
      CHECK(std::signbit(value.f) == std::signbit(expected));
    }
  } else if (kind == "int") {
    REQUIRE(value.kind == StateValue::Kind::kInt);
    CHECK(value.i == std::stoll(text));
  } else {
    REQUIRE(kind == "bool");
    REQUIRE(value.kind == StateValue::Kind::kBool);
    CHECK(value.b == (text == "True"));
  }
}

// ---- building and patching files ----

void put_le(std::string& bytes, std::size_t offset, std::uint64_t value, int width) {
  REQUIRE(offset + static_cast<std::size_t>(width) <= bytes.size());
  for (int k = 0; k < width; ++k, value >>= 8) bytes[offset + k] = static_cast<char>(value & 0xff);
}
std::uint64_t get_le(const std::string& bytes, std::size_t offset, int width) {
  REQUIRE(offset + static_cast<std::size_t>(width) <= bytes.size());
  std::uint64_t value = 0;
  for (int k = width - 1; k >= 0; --k)
    value = (value << 8) | static_cast<unsigned char>(bytes[offset + k]);
  return value;
}
// (No REQUIRE here: the pickle constants below are built before Catch2 runs.)
std::string le(std::uint64_t value, int width) {
  std::string bytes;
  for (int k = 0; k < width; ++k, value >>= 8) bytes += static_cast<char>(value & 0xff);
  return bytes;
}

struct Entry {
  std::string name;
  std::string data;
  std::uint16_t method = 0;
};

// A zip of stored entries, written from the format's specification (APPNOTE 4.3): local headers
// with their data, the central directory, the end record. CRCs come from crc32(), itself checked
// against the standard check values below.
std::string make_zip(const std::vector<Entry>& entries) {
  std::string file, directory;
  for (const Entry& e : entries) {
    const std::uint32_t crc = amp::detail::crc32(e.data);
    const std::size_t local = file.size();
    const std::string common = le(e.method, 2) + le(0, 2) + le(0, 2) + le(crc, 4) +
                               le(e.data.size(), 4) + le(e.data.size(), 4) + le(e.name.size(), 2) +
                               le(0, 2);
    file += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + common + e.name + e.data;
    directory += le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 2) + common + le(0, 2) +
                 le(0, 2) + le(0, 2) + le(0, 4) + le(local, 4) + e.name;
  }
  const std::size_t directory_offset = file.size();
  file += directory;
  file += le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(entries.size(), 2) + le(entries.size(), 2) +
          le(directory.size(), 4) + le(directory_offset, 4) + le(0, 2);
  return file;
}

// A state file like torch.save's holding `pickle` as archive/data.pkl.
std::string state_zip(const std::string& pickle) {
  return make_zip({{"archive/data.pkl", pickle}, {"archive/version", "3\n"}});
}

// Pickles, byte by byte (opcodes as pickletools names them).
const std::string kHead = std::string("\x80\x02", 2) + "}";  // PROTO 2, EMPTY_DICT
std::string unicode(const std::string& text) { return "X" + le(text.size(), 4) + text; }
std::string binfloat(double value) {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::string bytes = "G";
  for (int k = 7; k >= 0; --k) bytes += static_cast<char>((bits >> (8 * k)) & 0xff);
  return bytes;
}
// {"scale": 2.0, "growth_interval": 7} in protocol 2 opcodes, without the memo stores Python adds.
const std::string kSmallPickle =
    kHead + "(" + unicode("scale") + binfloat(2.0) + unicode("growth_interval") + "K\x07" + "u.";

std::string refusal(std::string_view bytes) {
  try {
    parse_state_file(bytes);
  } catch (const amp::detail::ReaderError& e) {
    return e.what();
  }
  FAIL("the file was accepted");
  return {};
}

std::string pickle_refusal(std::string_view pickle) {
  try {
    parse_state_pickle(pickle, "archive/data.pkl");
  } catch (const amp::detail::ReaderError& e) {
    return e.what();
  }
  FAIL("the pickle was accepted");
  return {};
}

// A Python-written state file and where its parts are, found from the zip records themselves.
struct PythonFile {
  std::string bytes = read_file(kCorpus + "/py_float_scale_p2.pt");
  std::size_t eocd = bytes.rfind(std::string("PK\x05\x06", 4));
  std::size_t directory = get_le(bytes, eocd + 16, 4);  // first central record: data.pkl
  std::size_t pickle = 30 + get_le(bytes, 26, 2) + get_le(bytes, 28, 2);  // data after header 0
  std::size_t pickle_size = get_le(bytes, directory + 24, 4);

  // Sets byte `offset` of data.pkl and records the new CRC, so the pickle reader sees it.
  void patch_pickle(std::size_t offset, char value) {
    bytes[pickle + offset] = value;
    put_le(bytes, directory + 16,
           amp::detail::crc32(std::string_view(bytes).substr(pickle, pickle_size)), 4);
  }
};

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("amp_state_file_" + std::to_string(::getpid()) + "_" + name);
}

}  // namespace

// ---- accepted files ----

TEST_CASE("The state file reader's crc32 gives the standard CRC-32 check values", "[state][file]") {
  CHECK(amp::detail::crc32("") == 0u);
  CHECK(amp::detail::crc32("a") == 0xe8b7be43u);
  CHECK(amp::detail::crc32("123456789") == 0xcbf43926u);
}

const std::vector<std::string> kPythonFiles = {
    "py_float_scale_p2.pt", "py_int_scale_p2.pt", "py_float_scale_p4.pt", "py_int_scale_p5.pt",
    "py_amp_keys_p2.pt",    "py_amp_keys_p5.pt",  "py_one_entry_p2.pt",   "py_extremes_p4.pt"};

TEST_CASE("Every state file Python's torch.save wrote is read as torch.load reads it",
          "[state][file][python]") {
  // torch.load's rows of every file, from one Python run (importing torch takes seconds).
  std::string args = "dump";
  for (const std::string& name : kPythonFiles) args += " \"" + kCorpus + "/" + name + "\"";
  std::map<std::string, std::vector<std::vector<std::string>>> rows_by_file;
  for (auto& row : python_rows(args)) {
    REQUIRE(row.size() == 4);
    rows_by_file[row[0]].push_back(row);
  }
  for (const std::string& name : kPythonFiles) {
    CAPTURE(name);
    const std::string path = kCorpus + "/" + name;
    const auto& expected = rows_by_file[path];
    const StateEntries entries = parse_state_file(read_file(path));
    REQUIRE(entries.size() == expected.size());
    for (std::size_t k = 0; k < entries.size(); ++k) {
      REQUIRE(expected[k].size() == 4);
      CAPTURE(expected[k][1]);
      CHECK(entries[k].first == expected[k][1]);  // same keys in the same order
      check_value(entries[k].second, expected[k][2], expected[k][3]);
    }
  }
}

TEST_CASE("A state file's scale is read as the float or int Python wrote", "[state][file]") {
  const StateEntries floats = parse_state_file(read_file(kCorpus + "/py_float_scale_p2.pt"));
  REQUIRE(floats.size() == 5);
  CHECK(floats[0].first == "scale");
  CHECK(floats[0].second.kind == StateValue::Kind::kFloat);
  const StateEntries ints = parse_state_file(read_file(kCorpus + "/py_int_scale_p5.pt"));
  REQUIRE(ints.size() == 5);
  CHECK(ints[0].first == "scale");
  CHECK(ints[0].second.kind == StateValue::Kind::kInt);
  CHECK(ints[0].second.i == 1024);
}

TEST_CASE("amp::detail::read_zip_directory lists a state file's entries as Python's zipfile does",
          "[state][file][python]") {
  const std::string path = kCorpus + "/py_amp_keys_p5.pt";
  const auto expected = python_rows("zip \"" + path + "\"");
  const auto entries = amp::detail::read_zip_directory(read_file(path));
  REQUIRE(entries.size() == expected.size());
  REQUIRE(entries.size() == 6);
  for (std::size_t k = 0; k < entries.size(); ++k) {
    CAPTURE(expected[k][0]);
    CHECK(entries[k].name == expected[k][0]);
    CHECK(entries[k].data_offset == std::stoull(expected[k][1]));
    CHECK(entries[k].size == std::stoull(expected[k][2]));
    CHECK(entries[k].compressed_size == entries[k].size);
    CHECK(entries[k].method == std::stoul(expected[k][3]));
    CHECK(entries[k].crc32 == std::stoul(expected[k][4]));
  }
}

TEST_CASE("A state file GradScaler::save_state_dict wrote is read back key by key",
          "[state][file]") {
  amp::GradScaler scaler(torch::kCPU, amp::GradScalerOptions()
                                          .init_scale(512.0)
                                          .growth_factor(4.0)
                                          .backoff_factor(0.125)
                                          .growth_interval(9)
                                          .hysteresis(3)
                                          .consecutive_hysteresis(true)
                                          .min_scale(0.5)
                                          .max_scale(1e9)
                                          .track_counters(true));
  const auto path = temp_path("amp.pt");
  scaler.save_state_dict(path.string());
  const std::string bytes = read_file(path.string());
  std::filesystem::remove(path);

  const StateEntries entries = parse_state_file(bytes);
  const auto written = scaler.state_dict();
  REQUIRE(entries.size() == written.size());
  REQUIRE(entries.size() == 14);  // Python's five keys and amp's nine
  for (const auto& [key, value] : entries) {
    CAPTURE(key);
    REQUIRE(written.contains(key));
    const c10::IValue expected = written.at(key);
    if (expected.isDouble()) {
      REQUIRE(value.kind == StateValue::Kind::kFloat);
      CHECK(value.f == expected.toDouble());
    } else if (expected.isBool()) {
      REQUIRE(value.kind == StateValue::Kind::kBool);
      CHECK(value.b == expected.toBool());
    } else {
      REQUIRE(expected.isInt());
      REQUIRE(value.kind == StateValue::Kind::kInt);
      CHECK(value.i == expected.toInt());
    }
  }
  CHECK(entries[0].second.f == 512.0);
}

TEST_CASE("A state file pickle's memo stores and fetches, MEMOIZE and SETITEM are read",
          "[state][file]") {
  const std::string q0("q\x00", 2);
  const std::string pickle =
      kHead + q0 +                                                        // the dict at memo 0
      "(" + unicode("scale") + "q\x01" + binfloat(2.0) + "q\x02" + "u" +  // scale = 2.0, memo 2
      unicode("x") + "r" + le(4095, 4) + "h\x02" + "s" +                  // x = memo 2 (BINGET)
      "\x8c\x01y" + "\x94" + "J" + le(0xfffffff9u, 4) + "r" + le(7, 4) + "s" +  // y = -7, memo 7
      unicode("z") + "j" + le(7, 4) + "s" +  // z = memo 7 (LONG_BINGET)
      "q\x08.";                              // the dict memoized last, as LibTorch's Pickler does
  const StateEntries entries = parse_state_pickle(pickle);
  REQUIRE(entries.size() == 4);
  CHECK(entries[0].first == "scale");
  CHECK(entries[0].second.f == 2.0);
  CHECK(entries[1].first == "x");
  CHECK(entries[1].second.kind == StateValue::Kind::kFloat);
  CHECK(entries[1].second.f == 2.0);
  CHECK(entries[2].first == "y");
  CHECK(entries[2].second.i == -7);
  CHECK(entries[3].first == "z");
  CHECK(entries[3].second.kind == StateValue::Kind::kInt);
  CHECK(entries[3].second.i == -7);
}

TEST_CASE("A state file zipped from the specification around a pickle is read", "[state][file]") {
  // Checks the test's own make_zip, on which the refusal tests below rely.
  const StateEntries entries = parse_state_file(state_zip(kSmallPickle));
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].first == "scale");
  CHECK(entries[0].second.f == 2.0);
  CHECK(entries[1].first == "growth_interval");
  CHECK(entries[1].second.i == 7);
}

// ---- refused zips ----

TEST_CASE("Empty, truncated and non-zip state files are refused", "[state][file][refuse]") {
  CHECK_THAT(refusal(""), Contains("the file is 0 bytes, too short for a zip archive"));
  const std::string file = read_file(kCorpus + "/py_float_scale_p2.pt");
  const std::size_t size = GENERATE(1, 21, 22, 30, 64, 200, 900, 1100, 1260, 1400, 1448);
  CAPTURE(size);
  REQUIRE(size < file.size());
  const std::string message = refusal(file.substr(0, size));
  if (size < 22) {
    CHECK_THAT(message, Contains("too short for a zip archive"));
  } else {
    CHECK_THAT(message, Contains("no zip end-of-central-directory record in the last"));
    CHECK_THAT(message, Contains("not a zip archive, or it is truncated"));
  }
  CHECK_THAT(refusal(kSmallPickle + std::string(100, ' ')),
             Contains("no zip end-of-central-directory record"));
}

TEST_CASE("A state file whose pickle is truncated at any opcode is refused",
          "[state][file][refuse]") {
  for (std::size_t size = 1; size < kSmallPickle.size(); ++size) {
    CAPTURE(size);
    const std::string message = refusal(state_zip(kSmallPickle.substr(0, size)));
    const bool truncated = message.find("the pickle is truncated") != std::string::npos;
    CHECK(truncated);
  }
  CHECK_THAT(refusal(state_zip(kSmallPickle.substr(0, 7))),
             Contains("'archive/data.pkl' byte 4: opcode 0x58 (BINUNICODE) needs 4 argument bytes "
                      "but the pickle ends after 2; the pickle is truncated"));
  CHECK_THAT(refusal(state_zip(kSmallPickle.substr(0, kSmallPickle.size() - 1))),
             Contains("'archive/data.pkl' byte 46: the pickle ends without STOP (0x2e); the "
                      "pickle is truncated"));
}

TEST_CASE("ZIP64 markers in a state file's end record are read from its ZIP64 record",
          "[state][file][zip64]") {
  PythonFile file;
  const StateEntries expected = parse_state_file(file.bytes);
  // torch.save writes a ZIP64 record beside the ordinary one: each marked field is taken from it.
  SECTION("entry count 0xFFFF") {
    put_le(file.bytes, file.eocd + 8, 0xffff, 2);
    put_le(file.bytes, file.eocd + 10, 0xffff, 2);
  }
  SECTION("central directory size 0xFFFFFFFF") {
    put_le(file.bytes, file.eocd + 12, 0xffffffff, 4);
  }
  SECTION("central directory offset 0xFFFFFFFF") {
    put_le(file.bytes, file.eocd + 16, 0xffffffff, 4);
  }
  const StateEntries read = parse_state_file(file.bytes);
  REQUIRE(read.size() == expected.size());
  for (std::size_t k = 0; k < read.size(); ++k) {
    CHECK(read[k].first == expected[k].first);
    CHECK(read[k].second.kind == expected[k].second.kind);
    CHECK(read[k].second.f == expected[k].second.f);
    CHECK(read[k].second.i == expected[k].second.i);
  }
}

TEST_CASE("ZIP64 markers in a state file are refused where no ZIP64 record gives the values",
          "[state][file][refuse]") {
  PythonFile file;
  SECTION("markers in an archive without a ZIP64 record") {
    std::string bytes = state_zip(kSmallPickle);
    const std::size_t eocd = bytes.rfind(std::string("PK\x05\x06", 4));
    put_le(bytes, eocd + 12, 0xffffffff, 4);
    CHECK_THAT(refusal(bytes), Contains("directory size 0xffffffff") &&
                                   Contains("no ZIP64 end-of-central-directory locator"));
  }
  SECTION("an entry's sizes 0xFFFFFFFF") {
    put_le(file.bytes, file.directory + 20, 0xffffffff, 4);
    CHECK_THAT(refusal(file.bytes),
               Contains("zip entry 'py_float_scale_p2/data.pkl' has ZIP64 markers"));
  }
  SECTION("a ZIP64 end record that disagrees with the ordinary one") {
    // torch.save writes a ZIP64 record (56 bytes) and locator (20) before the end record.
    const std::size_t record = file.eocd - 20 - 56;
    REQUIRE(get_le(file.bytes, record, 4) == 0x06064b50);
    put_le(file.bytes, record + 32, 1000000, 8);
    CHECK_THAT(refusal(file.bytes), Contains("file byte " + std::to_string(record) +
                                             ": the ZIP64 end-of-central-directory record "
                                             "disagrees"));
  }
}

TEST_CASE("Inconsistent zip counts, sizes and offsets in a state file are refused",
          "[state][file][refuse]") {
  PythonFile file;
  // A zip without torch.save's ZIP64 record, which would otherwise disagree first.
  std::string zip = state_zip(kSmallPickle);
  const std::size_t eocd = zip.size() - 22;
  SECTION("more entries than the central directory can hold") {
    put_le(zip, eocd + 8, 1000, 2);
    put_le(zip, eocd + 10, 1000, 2);
    CHECK_THAT(refusal(zip), Contains("lists 1000 entries, which cannot fit in a central "
                                      "directory of"));
  }
  SECTION("fewer entries than the central directory holds") {
    put_le(zip, eocd + 8, 1, 2);
    put_le(zip, eocd + 10, 1, 2);
    CHECK_THAT(refusal(zip), Contains("the central directory has 61 bytes after its 1 records"));
  }
  SECTION("more entries than accepted") {
    put_le(file.bytes, file.eocd + 8, 1025, 2);
    put_le(file.bytes, file.eocd + 10, 1025, 2);
    CHECK_THAT(refusal(file.bytes), Contains("lists 1025 entries; at most 1024 are accepted"));
  }
  SECTION("a central directory past the end of the file") {
    put_le(zip, eocd + 16, 0x7fffffff, 4);
    CHECK_THAT(refusal(zip), Contains("file byte 2147483647: the central directory (123 bytes) "
                                      "runs past its end record at byte"));
  }
  SECTION("an entry larger than the file") {
    put_le(file.bytes, file.directory + 20, 0x7fffffff, 4);
    put_le(file.bytes, file.directory + 24, 0x7fffffff, 4);
    CHECK_THAT(refusal(file.bytes),
               Contains("file byte 64: zip entry 'py_float_scale_p2/data.pkl': its 2147483647 "
                        "bytes of data run past the start of the central directory"));
  }
  SECTION("a local header offset past the central directory") {
    put_le(file.bytes, file.directory + 42, 0xfffffff0, 4);
    CHECK_THAT(refusal(file.bytes), Contains("its local header at byte 4294967280 is not before "
                                             "the central directory"));
  }
  SECTION("a name longer than the directory") {
    put_le(file.bytes, file.directory + 28, 0xffff, 2);
    CHECK_THAT(refusal(file.bytes), Contains("runs past the end of the central directory"));
  }
  SECTION("a local header naming another entry") {
    file.bytes[30] = 'Q';
    CHECK_THAT(refusal(file.bytes), Contains("file byte 0: zip entry 'py_float_scale_p2/data.pkl': "
                                             "its local header names it "
                                             "'Qy_float_scale_p2/data.pkl'"));
  }
}

TEST_CASE("Compressed, damaged, missing or duplicated entries in a state file are refused",
          "[state][file][refuse]") {
  Entry compressed{"archive/data.pkl", kSmallPickle, 8};
  CHECK_THAT(refusal(make_zip({compressed})),
             Contains("zip entry 'archive/data.pkl' is compressed (method 8"));
  CHECK_THAT(refusal(make_zip({{"archive/version", "3\n"}})),
             Contains("the zip archive has no entry 'archive/data.pkl'"));
  CHECK_THAT(refusal(make_zip({})), Contains("the zip archive has no entries"));
  CHECK_THAT(refusal(make_zip({{"archive/data.pkl", kSmallPickle}, {"archive/data.pkl", "x"}})),
             Contains("zip entry 'archive/data.pkl' appears twice in the archive"));
  CHECK_THAT(refusal(make_zip({{"archive/data.pkl", kSmallPickle}, {"other/version", "3\n"}})),
             Contains("zip entry 'other/version' is outside the directory 'archive/'"));
  CHECK_THAT(refusal(make_zip({{"data.pkl", kSmallPickle}})),
             Contains("zip entry 'data.pkl' is not inside a directory"));
  CHECK_THAT(refusal(make_zip({{std::string("archive/data.pkl\0x", 18), kSmallPickle}})),
             Contains("has a name of 18 bytes containing NUL"));

  PythonFile file;
  file.bytes[file.pickle + 20] ^= 1;  // inside BINFLOAT 1024.0 (the scale)
  CHECK_THAT(refusal(file.bytes), Contains("zip entry 'py_float_scale_p2/data.pkl' has CRC-32 "));
  CHECK_THAT(refusal(file.bytes), Contains("its bytes are damaged"));
  const std::string big = kHead + "(" + std::string(70000, '(');
  CHECK_THAT(refusal(state_zip(big)), Contains("zip entry 'archive/data.pkl' is 70004 bytes; a "
                                               "state dict's pickle is at most 65536 bytes"));
  CHECK_THAT(refusal(std::string(amp::detail::kMaxStateFileSize + 1, 'P')),
             Contains("the file is 1048577 bytes; a GradScaler state file is at most 1048576"));
}

// ---- refused pickles ----

TEST_CASE(
    "Opcodes other than a flat dict of numbers in a state file are refused, named, at their offset",
    "[state][file][refuse]") {
  SECTION("an unknown opcode in a Python-written file") {
    PythonFile file;
    file.patch_pickle(5, '\xff');  // MARK of Python's pickle at byte 5
    CHECK_THAT(refusal(file.bytes),
               Contains("'py_float_scale_p2/data.pkl' byte 5: byte 0xff (not a pickle opcode) is "
                        "not allowed in a GradScaler state file; a state dict holds only numbers"));
  }
  SECTION("a tensor record (BINPERSID)") {
    const std::string pickle = kHead + "(" + unicode("scale") + "(" + unicode("storage") + "tQ";
    // A persistent id needs a tuple first; either opcode is refused where it stands.
    CHECK_THAT(refusal(state_zip(pickle)),
               Contains("'archive/data.pkl' byte 14: MARK opens a second group"));
    CHECK_THAT(refusal(state_zip(kHead + "(" + unicode("scale") + "Q")),
               Contains("'archive/data.pkl' byte 14: opcode 0x51 (BINPERSID, a tensor record) is "
                        "not allowed in a GradScaler state file; a state dict holds only numbers"));
  }
  SECTION("GLOBAL without its newline") {
    CHECK_THAT(pickle_refusal(kHead + "ctorch._utils _rebuild_tensor_v2"),
               Contains("byte 3: opcode 0x63 (GLOBAL, an import of a Python object) is not "
                        "allowed"));
  }
  SECTION("lists, tuples, None, nested dicts") {
    CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + "]"),
               Contains("byte 10: opcode 0x5d (EMPTY_LIST, a list) is not allowed"));
    CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + ")"),
               Contains("byte 10: opcode 0x29 (EMPTY_TUPLE, a tuple)"));
    CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + "N"),
               Contains("byte 10: opcode 0x4e (NONE, None)"));
    CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + "}"),
               Contains("byte 10: a second dict (EMPTY_DICT)"));
    CHECK_THAT(pickle_refusal(std::string("\x80\x02K\x01", 4)),
               Contains("byte 2: opcode 0x4b (BININT1) comes before the dict"));
  }
  SECTION("protocols torch.save does not write") {
    CHECK_THAT(pickle_refusal(std::string("\x80\x01}.", 4)),
               Contains("'archive/data.pkl' byte 0: pickle protocol 1 is not one torch.save or "
                        "LibTorch writes (2 to 5)"));
    CHECK_THAT(pickle_refusal("}."), Contains("byte 0: the pickle starts with opcode 0x7d "
                                              "(EMPTY_DICT) instead of PROTO"));
    CHECK_THAT(pickle_refusal(""), Contains("'archive/data.pkl' byte 0: the entry is empty"));
  }
}

TEST_CASE("Huge lengths, indices and nesting in a state file are refused at once",
          "[state][file][refuse]") {
  const auto start = std::chrono::steady_clock::now();
  SECTION("BINUNICODE of 2^32-1 bytes, and a key longer than accepted") {
    CHECK_THAT(refusal(state_zip(kHead + "(X" + le(0xffffffff, 4))),
               Contains("'archive/data.pkl' byte 4: opcode 0x58 (BINUNICODE) needs 4294967295 "
                        "argument bytes but the pickle ends after 0; the pickle is truncated"));
    CHECK_THAT(refusal(state_zip(kHead + "(" + unicode(std::string(300, 'k')) + "K\x01u.")),
               Contains("'archive/data.pkl' byte 4: opcode 0x58 (BINUNICODE) holds a string of "
                        "300 bytes; state dict keys are at most 256 bytes"));
  }
  SECTION("LONG_BINPUT index 2^28") {
    CHECK_THAT(refusal(state_zip(kHead + "r" + le(1u << 28, 4))),
               Contains("byte 3: opcode 0x72 (LONG_BINPUT) uses memo index 268435456; a state "
                        "file uses indices below 4096"));
  }
  SECTION("memo fetches of nothing, or of the dict") {
    CHECK_THAT(pickle_refusal(kHead + "j" + le(1u << 28, 4)),
               Contains("byte 3: opcode 0x6a (LONG_BINGET) fetches memo index 268435456, which "
                        "nothing was stored at"));
    CHECK_THAT(
        pickle_refusal(kHead + std::string("q\x00(", 3) + unicode("a") + std::string("h\x00", 2)),
        Contains("byte 12: opcode 0x68 (BINGET) fetches the dict itself"));
  }
  SECTION("FRAME longer than the pickle") {
    CHECK_THAT(pickle_refusal(std::string("\x80\x04\x95", 3) + le(1ull << 62, 8)),
               Contains("byte 2: FRAME announces 4611686018427387904 bytes but only 0 follow"));
  }
  SECTION("LONG1 wider than int64") {
    CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + "\x8a\x09" + std::string(9, '\x01')),
               Contains("byte 10: LONG1 holds an int of 9 bytes, which does not fit int64"));
  }
  SECTION("10^6 nested MARKs") {
    const std::string marks = kHead + std::string(1000000, '(') + ".";
    CHECK_THAT(pickle_refusal(marks),
               Contains("'archive/data.pkl' byte 4: MARK opens a second group while 1 items are "
                        "pending"));
    CHECK_THAT(pickle_refusal(std::string("\x80\x02", 2) + std::string(1000000, '(')),
               Contains("byte 2: MARK comes before the dict"));
    CHECK_THAT(refusal(state_zip(marks)), Contains("is 1000004 bytes; a state dict's pickle is at "
                                                   "most 65536 bytes"));
  }
  SECTION("10^6 nested EMPTY_LISTs") {
    CHECK_THAT(pickle_refusal(kHead + std::string(1000000, ']')),
               Contains("byte 3: opcode 0x5d (EMPTY_LIST, a list) is not allowed"));
  }
  SECTION("more pending values than a state dict has entries") {
    std::string pickle = kHead + "(";
    for (int k = 0; k < 600; ++k) pickle += "K\x01";
    CHECK_THAT(pickle_refusal(pickle),
               Contains("more than 512 keys and values are pending; a state dict has at most 256 "
                        "entries"));
  }
  // Each input is refused at its first bad opcode or length: far below a second even unoptimized.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
}

TEST_CASE("A state file pickle must end with STOP, hold no more, and keep its dict flat and unique",
          "[state][file][refuse]") {
  CHECK_THAT(refusal(state_zip(kSmallPickle.substr(0, kSmallPickle.size() - 1))),
             Contains("the pickle ends without STOP"));
  CHECK_THAT(refusal(state_zip(kSmallPickle + "K")),
             Contains("'archive/data.pkl' byte 47: the pickle goes on for 1 more byte(s) after "
                      "STOP (at byte 46); STOP must be its last byte"));
  CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + "K\x01" + unicode("a") + "K\x02" + "u."),
             Contains("byte 12: key 'a' appears twice in the dict"));
  CHECK_THAT(pickle_refusal(kHead + "(" + "K\x01" + "K\x02" + "u."),
             Contains("byte 4: a key is an int, not a string; state dict keys are strings"));
  CHECK_THAT(pickle_refusal(kHead + "(" + binfloat(1.0) + "K\x02" + "u."),
             Contains("byte 4: a key is a float, not a string"));
  CHECK_THAT(
      pickle_refusal(kHead + "(" + unicode("a") + unicode("b") + "u."),
      Contains("byte 10: the value of key 'a' is a string; a state dict holds only numbers"));
  CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + "u."),
             Contains("SETITEMS finds 1 items after the MARK at byte 3: a key has no value"));
  CHECK_THAT(pickle_refusal(kHead + "(" + unicode("a") + "K\x01" + "."),
             Contains("STOP while the MARK at byte 3 is not closed by SETITEMS"));
  CHECK_THAT(pickle_refusal(kHead + "K\x01."),
             Contains("STOP leaves 1 items unused after the dict (the first, an int, at byte 3)"));
  CHECK_THAT(pickle_refusal(kHead + "u."), Contains("byte 3: SETITEMS without a MARK"));
  CHECK_THAT(pickle_refusal(kHead + "K\x01s."), Contains("byte 5: SETITEM needs the dict, a key"));
  CHECK_THAT(pickle_refusal(kHead + "(" + unicode("\xff\xfe") + "K\x01" + "u."),
             Contains("byte 4: the string '\\xff\\xfe' is not valid UTF-8 (its byte 0)"));
  std::string many = kHead + "(";
  for (int k = 0; k < 256; ++k) many += unicode("k" + std::to_string(k)) + "K\x01";
  many += "u(" + unicode("one too many") + "K\x01" + "u.";
  CHECK_THAT(pickle_refusal(many), Contains("the dict has more than 256 entries"));
}

TEST_CASE("Non-finite floats in a state file are passed through for the scaler's own checks",
          "[state][file]") {
  const StateEntries entries =
      parse_state_pickle(kHead + "(" + unicode("scale") + binfloat(std::nan("")) +
                         unicode("growth_factor") + binfloat(INFINITY) + "u.");
  REQUIRE(entries.size() == 2);
  CHECK(std::isnan(entries[0].second.f));
  CHECK(entries[1].second.f == INFINITY);
}
