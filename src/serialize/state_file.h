// A strict reader for GradScaler state files (torch.save's zip of a flat dict of numbers).
//
// LibTorch's general reader (miniz + the TorchScript unpickler) trusts the file's sizes, counts
// and opcodes: a damaged or hostile file can crash it, hang it or make it allocate gigabytes. A
// scaler's state is a handful of numbers, so amp reads it with this reader instead: it accepts
// exactly what torch.save (pickle protocols 2, 4, 5) and GradScaler::save_state_dict write,
// refuses everything else with a sentence, runs in O(file size) and allocates a bounded amount.
// Standard C++ and zlib only (no torch): the fuzzer builds it without LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serialize/reader_error.h"

namespace amp::detail {

/// The largest state file read (about 1.3 KiB is usual): GradScaler::load_state_dict refuses a
/// larger file before mapping it, parse_state_file a larger buffer.
constexpr std::size_t kMaxStateFileSize = std::size_t{1} << 20;
/// The largest data.pkl accepted (the pickle of the dict; about 400 bytes with amp's keys).
constexpr std::size_t kMaxStatePickleSize = std::size_t{64} << 10;
/// The longest key accepted, in bytes.
constexpr std::size_t kMaxStateKeyLength = 256;
/// The most dict entries accepted.
constexpr std::size_t kMaxStateEntries = 256;
/// Memo indices (BINPUT, LONG_BINPUT, MEMOIZE) must be below this.
constexpr std::uint32_t kMaxPickleMemoIndex = 4096;

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

/// Parses a whole state file (`bytes`: the file's contents, at most kMaxStateFileSize): a zip
/// (read_archive_directory: every entry under one directory `<d>/`, names unique) whose entries
/// are all stored uncompressed, with a `<d>/data.pkl` of at most kMaxStatePickleSize bytes whose
/// CRC-32 matches; its pickle is read by parse_state_pickle. Throws ReaderError saying what is
/// wrong and where.
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

}  // namespace amp::detail
