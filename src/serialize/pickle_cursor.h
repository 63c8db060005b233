// Reads a pickle one opcode at a time for amp's strict readers: one table of every opcode of
// protocols 0 to 5 (name, operand layout), each operand decoded and bounds-checked, and the rules
// every pickle torch.save or LibTorch writes follows (PROTO 2 to 5 first, STOP last).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "serialize/reader_error.h"

namespace amp::detail {

/// The opcodes amp's readers act on, named as pickletools names them.
namespace opcode {
inline constexpr unsigned char kMark = 0x28, kEmptyTuple = 0x29, kStop = 0x2e, kBinFloat = 0x47,
                               kBinInt = 0x4a, kBinInt1 = 0x4b, kBinInt2 = 0x4d, kNone = 0x4e,
                               kBinPersId = 0x51, kReduce = 0x52, kBinUnicode = 0x58,
                               kEmptyList = 0x5d, kAppend = 0x61, kBuild = 0x62, kGlobal = 0x63,
                               kAppends = 0x65, kBinGet = 0x68, kLongBinGet = 0x6a, kBinPut = 0x71,
                               kLongBinPut = 0x72, kSetItem = 0x73, kTuple = 0x74, kSetItems = 0x75,
                               kEmptyDict = 0x7d, kProto = 0x80, kNewObj = 0x81, kTuple1 = 0x85,
                               kTuple2 = 0x86, kTuple3 = 0x87, kNewTrue = 0x88, kNewFalse = 0x89,
                               kLong1 = 0x8a, kShortBinUnicode = 0x8c, kMemoize = 0x94,
                               kFrame = 0x95;
}  // namespace opcode

/// The longest text-line operand (GLOBAL's module and name) read, in bytes.
constexpr std::size_t kMaxPickleLineLength = 256;

/// One opcode as PickleCursor::next read it, its operand decoded.
struct PickleOp {
  std::size_t at = 0;        ///< the opcode's offset in the pickle
  unsigned char code = 0;    ///< the opcode
  std::uint64_t number = 0;  ///< an unsigned operand (memo index, FRAME length, ...)
  std::int64_t integer = 0;  ///< an int operand (BININT*, LONG1), the unsigned ones as well
  double real = 0.0;         ///< BINFLOAT's value
  std::string_view text;     ///< a string operand (UTF-8 checked for text), or the first line
  std::string_view text2;    ///< the second line of GLOBAL and INST
};

/// The opcodes a reader handles, by code; PickleCursor::next refuses every other one.
using PickleOpcodeSet = std::array<bool, 256>;
/// The set of `codes`.
constexpr PickleOpcodeSet pickle_opcodes(std::initializer_list<unsigned char> codes) {
  PickleOpcodeSet set{};
  for (unsigned char code : codes) set[code] = true;
  return set;
}

/// "opcode 0x4b (BININT1)", or "byte 0xff (not a pickle opcode)".
std::string describe_pickle_opcode(unsigned char code);

/// A read position in one pickle, the base of both pickle readers: decodes each opcode's operand
/// from the one opcode table and refuses, naming the entry and the byte, what no reader accepts.
class PickleCursor {
 protected:
  /// `entry_name` is quoted in messages. `accepted`: the opcodes the reader handles (PROTO is
  /// handled here); `refusal` follows any other opcode in its message ("is not allowed in ...").
  PickleCursor(std::string_view pickle, std::string_view entry_name,
               const PickleOpcodeSet& accepted, std::string_view refusal)
      : data_(pickle),
        entry_name_(entry_name),
        where_(quoted(entry_name)),
        accepted_(accepted),
        refusal_(refusal) {}

  /// The next opcode after PROTO, its operand decoded. Refuses an empty pickle, a first opcode
  /// other than PROTO with protocol 2 to 5 and any later PROTO, an opcode outside `accepted`
  /// (before reading its operand), an operand running past the end, text that is not UTF-8, a
  /// text line longer than kMaxPickleLineLength, a LONG1 wider than int64, bytes after STOP and
  /// an end without STOP. Takes O(operand size) time whatever the bytes.
  PickleOp next();

  /// Throws ReaderError "<entry> byte <offset>: <args...>".
  template <typename... Args>
  [[noreturn]] void fail_at(std::size_t offset, const Args&... args) const {
    detail::fail_at(where_, offset, args...);
  }

  /// The values pushed on `stack` since the last MARK (`marks`: the stack's size at each open
  /// MARK), which is closed; `op` at `offset` is the opcode that ends it, for the message.
  template <typename Value>
  std::vector<Value> pop_mark(std::vector<Value>& stack, std::vector<std::size_t>& marks,
                              std::size_t offset, unsigned char op) const {
    if (marks.empty()) fail_at(offset, describe_pickle_opcode(op), " has no MARK to end");
    const std::size_t start = marks.back();
    marks.pop_back();
    std::vector<Value> items(std::make_move_iterator(stack.begin() + static_cast<long>(start)),
                             std::make_move_iterator(stack.end()));
    stack.resize(start);
    return items;
  }

  /// Bytes left after the current position.
  std::size_t remaining() const { return data_.size() - pos_; }

  std::string_view data_;
  std::string_view entry_name_;  ///< as given, for checks on the name itself
  std::string where_;            ///< quoted(entry_name), for messages

 private:
  std::string_view take(const PickleOp& op, std::uint64_t n);
  std::uint64_t take_le(const PickleOp& op, int width);
  std::string_view take_line(const PickleOp& op);
  void decode(PickleOp& op);

  PickleOpcodeSet accepted_;
  std::string_view refusal_;
  std::size_t pos_ = 0;  ///< the next byte to read
};

}  // namespace amp::detail
