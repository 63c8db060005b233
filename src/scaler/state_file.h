// A strict reader for GradScaler state files (torch.save's zip of a flat dict of numbers).
//
// LibTorch's general reader (miniz + the TorchScript unpickler) trusts the file's sizes, counts
// and opcodes: a damaged or hostile file can crash it, hang it or make it allocate gigabytes. A
// scaler's state is a handful of numbers, so amp reads it with this reader instead: it accepts
// exactly what torch.save (pickle protocols 2, 4, 5) and GradScaler::save_state_dict write,
// refuses everything else with a sentence, runs in O(file size) and allocates a bounded amount.
// Standard C++17 only (no torch): the fuzzer compiles this file on its own with clang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace amp::detail {

/// The largest state file read; the caller checks the file's size before reading it. A state
/// file is about 1.3 KiB.
constexpr std::size_t kMaxStateFileSize = std::size_t{1} << 20;
/// The largest data.pkl accepted (the pickle of the dict; about 400 bytes with amp's keys).
constexpr std::size_t kMaxStatePickleSize = std::size_t{64} << 10;
/// The longest key accepted, in bytes.
constexpr std::size_t kMaxStateKeyLength = 256;
/// The most dict entries accepted.
constexpr std::size_t kMaxStateEntries = 256;
/// Memo indices (BINPUT, LONG_BINPUT, MEMOIZE) must be below this.
constexpr std::uint32_t kMaxPickleMemoIndex = 4096;
/// The most entries a zip archive may have for read_zip_directory.
constexpr std::size_t kMaxZipEntries = 1024;
/// The longest entry name read_zip_directory accepts, in bytes.
constexpr std::size_t kMaxZipNameLength = 1024;

/// Thrown for any file the readers refuse. The message says what is wrong and where (entry name,
/// byte offset, opcode); the caller prefixes the file's name and adds the fix.
class StateFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One value of a state dict: a Python float, int (fits int64) or bool.
struct StateValue {
  enum class Kind { kFloat, kInt, kBool };
  Kind kind = Kind::kFloat;
  double f = 0.0;      ///< the value when kind == kFloat
  std::int64_t i = 0;  ///< the value when kind == kInt
  bool b = false;      ///< the value when kind == kBool
};

/// A state dict's entries in the order the file lists them (keys are unique).
using StateEntries = std::vector<std::pair<std::string, StateValue>>;

/// One entry of a zip archive's central directory, checked against its local header.
struct ZipEntry {
  std::string name;
  std::uint64_t data_offset = 0;      ///< where the entry's (compressed) bytes start in the file
  std::uint64_t compressed_size = 0;  ///< bytes stored in the file
  std::uint64_t size = 0;             ///< bytes after decompression
  std::uint16_t method = 0;           ///< 0: stored, 8: deflate
  std::uint32_t crc32 = 0;            ///< CRC-32 of the uncompressed bytes, as recorded
};

/// Reads and checks the central directory of the zip archive `file` (the whole file's bytes).
/// Checks: the end-of-central-directory record is in the last 64 KiB + 22 bytes and its comment
/// ends the file; no ZIP64 markers (a ZIP64 record written next to an ordinary one, as LibTorch's
/// writer does, must agree with it); a single disk; at most kMaxZipEntries entries, consistent
/// with the directory's size; every central record and local header inside the file, the local
/// header agreeing with the central record (name, method, sizes); names of 1 to kMaxZipNameLength
/// bytes without NUL; no encryption; every entry's data inside the file, before the central
/// directory. Does not check CRCs or methods (see parse_state_file).
/// Throws StateFileError naming the record and byte offset when a check fails.
/// `max_entries` bounds the entry count (kMaxZipEntries for a state file; archives allow more).
std::vector<ZipEntry> read_zip_directory(std::string_view file,
                                         std::size_t max_entries = kMaxZipEntries);

/// Parses a whole state file (`bytes`: the file's contents, at most kMaxStateFileSize): a zip
/// whose entries all sit under one directory `<d>/`, all stored uncompressed, with exactly one
/// `<d>/data.pkl` of at most kMaxStatePickleSize bytes whose CRC-32 matches; its pickle is read
/// by parse_state_pickle. Throws StateFileError saying what is wrong and where.
StateEntries parse_state_file(std::string_view bytes);

/// Parses the pickle of a state dict (`entry_name` is used in messages): PROTO 2 to 5, then one
/// dict built with EMPTY_DICT and SETITEMS (after MARK) or SETITEM, keys str (BINUNICODE,
/// SHORT_BINUNICODE; at most kMaxStateKeyLength bytes of UTF-8, unique), values float (BINFLOAT),
/// int (BININT, BININT1, BININT2, LONG1 within int64) or bool (NEWTRUE, NEWFALSE); memo opcodes
/// (BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET) and FRAME; STOP as the last byte. Any other
/// opcode is refused at its offset, naming it. NaN and infinities are returned as they are.
/// Takes O(pickle.size()) time whatever the bytes; the caller bounds the size
/// (parse_state_file: kMaxStatePickleSize).
StateEntries parse_state_pickle(std::string_view pickle, std::string_view entry_name = "data.pkl");

/// The CRC-32 (ISO-HDLC, as zip uses) of `bytes`.
std::uint32_t crc32(std::string_view bytes);

// Shared with the archive checker (archive_check.cpp), which reads the same zip and pickle bytes.

/// `text` as a message may quote it: control and non-ASCII bytes as \xNN, quotes escaped, at
/// most 64 bytes then "...".
std::string printable_text(std::string_view text);
/// "opcode 0x51 (BINPERSID)", or "byte 0xff (not a pickle opcode)".
std::string describe_pickle_opcode(unsigned char code);
/// The offset of the first byte of `text` that is not well-formed UTF-8, or text.size().
std::size_t utf8_error_offset(std::string_view text);

/// Throws StateFileError with the arguments streamed into one message; both readers refuse a
/// file through it.
template <typename... Args>
[[noreturn]] void reject(const Args&... args) {
  std::ostringstream message;
  (message << ... << args);
  throw StateFileError(message.str());
}

/// A read position in one pickle, the base of both pickle readers: bounds-checked reads of an
/// opcode's argument bytes and refusals that name the entry and the byte.
class PickleCursor {
 protected:
  /// `entry_name` is quoted in messages; `truncated` says what a short pickle means ("the file
  /// is truncated", "the entry is truncated").
  PickleCursor(std::string_view data, std::string_view entry_name, std::string_view truncated)
      : data_(data), entry_name_(printable_text(entry_name)), truncated_(truncated) {}

  /// Throws StateFileError: "<entry> byte <offset>: <args...>".
  template <typename... Args>
  [[noreturn]] void fail_at(std::size_t offset, const Args&... args) const {
    reject(entry_name_, " byte ", offset, ": ", args...);
  }

  /// The next `n` argument bytes of the opcode `op` at `at`; refuses a pickle that ends first.
  std::string_view take(std::size_t at, unsigned char op, std::size_t n);
  /// The next `width` (1 to 8) bytes as a little-endian unsigned number.
  std::uint64_t take_le(std::size_t at, unsigned char op, int width);

  std::string_view data_;
  std::string entry_name_;
  std::string_view truncated_;
  std::size_t pos_ = 0;  ///< the next byte to read
};

}  // namespace amp::detail
