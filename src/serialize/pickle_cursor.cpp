// The pickle opcode table and PickleCursor: each opcode's operand decoded by its layout, every
// length checked against what is left before anything is read.
#include "serialize/pickle_cursor.h"

#include <array>
#include <cstring>

namespace amp::detail {

namespace {

// How an opcode's argument bytes are laid out.
enum class Operand : unsigned char {
  kNone,
  kUInt,      // a little-endian unsigned int of `width` bytes
  kInt4,      // BININT: a little-endian two's complement int of 4 bytes
  kFloat8,    // BINFLOAT: a big-endian IEEE double
  kLong1,     // a 1-byte length, then a little-endian two's complement int of that many bytes
  kBytes,     // a little-endian length of `width` bytes, then that many bytes
  kText,      // the same, the bytes UTF-8
  kLine,      // text up to a newline
  kTwoLines,  // two such lines: a module and a name
};

struct OpcodeInfo {
  unsigned char code;
  const char* name;
  const char* builds;  // what it would build, to say why a reader refuses it; or nullptr
  Operand operand;
  unsigned char width = 0;  // kUInt: the int's bytes; kBytes, kText: the length's bytes
};

// Every opcode of pickle protocols 0 to 5.
constexpr OpcodeInfo kOpcodes[] = {
    {0x28, "MARK", nullptr, Operand::kNone},
    {0x29, "EMPTY_TUPLE", "a tuple", Operand::kNone},
    {0x2e, "STOP", nullptr, Operand::kNone},
    {0x30, "POP", nullptr, Operand::kNone},
    {0x31, "POP_MARK", nullptr, Operand::kNone},
    {0x32, "DUP", nullptr, Operand::kNone},
    {0x42, "BINBYTES", "a bytes object", Operand::kBytes, 4},
    {0x43, "SHORT_BINBYTES", "a bytes object", Operand::kBytes, 1},
    {0x46, "FLOAT", "a text float", Operand::kLine},
    {0x47, "BINFLOAT", nullptr, Operand::kFloat8},
    {0x49, "INT", "a text int", Operand::kLine},
    {0x4a, "BININT", nullptr, Operand::kInt4},
    {0x4b, "BININT1", nullptr, Operand::kUInt, 1},
    {0x4c, "LONG", "a text int", Operand::kLine},
    {0x4d, "BININT2", nullptr, Operand::kUInt, 2},
    {0x4e, "NONE", "None", Operand::kNone},
    {0x50, "PERSID", "a tensor record", Operand::kLine},
    {0x51, "BINPERSID", "a tensor record", Operand::kNone},
    {0x52, "REDUCE", "a call of a Python object", Operand::kNone},
    {0x53, "STRING", "a text string", Operand::kLine},
    {0x54, "BINSTRING", "a byte string", Operand::kBytes, 4},
    {0x55, "SHORT_BINSTRING", "a byte string", Operand::kBytes, 1},
    {0x56, "UNICODE", "a text string", Operand::kLine},
    {0x58, "BINUNICODE", nullptr, Operand::kText, 4},
    {0x5d, "EMPTY_LIST", "a list", Operand::kNone},
    {0x61, "APPEND", "a list", Operand::kNone},
    {0x62, "BUILD", "an object's state", Operand::kNone},
    {0x63, "GLOBAL", "an import of a Python object", Operand::kTwoLines},
    {0x64, "DICT", "a dict from text pickles", Operand::kNone},
    {0x65, "APPENDS", "a list", Operand::kNone},
    {0x67, "GET", nullptr, Operand::kLine},
    {0x68, "BINGET", nullptr, Operand::kUInt, 1},
    {0x69, "INST", "an object", Operand::kTwoLines},
    {0x6a, "LONG_BINGET", nullptr, Operand::kUInt, 4},
    {0x6c, "LIST", "a list", Operand::kNone},
    {0x6f, "OBJ", "an object", Operand::kNone},
    {0x70, "PUT", nullptr, Operand::kLine},
    {0x71, "BINPUT", nullptr, Operand::kUInt, 1},
    {0x72, "LONG_BINPUT", nullptr, Operand::kUInt, 4},
    {0x73, "SETITEM", nullptr, Operand::kNone},
    {0x74, "TUPLE", "a tuple", Operand::kNone},
    {0x75, "SETITEMS", nullptr, Operand::kNone},
    {0x7d, "EMPTY_DICT", nullptr, Operand::kNone},
    {0x80, "PROTO", nullptr, Operand::kUInt, 1},
    {0x81, "NEWOBJ", "an object", Operand::kNone},
    {0x82, "EXT1", "an import of a Python object", Operand::kUInt, 1},
    {0x83, "EXT2", "an import of a Python object", Operand::kUInt, 2},
    {0x84, "EXT4", "an import of a Python object", Operand::kUInt, 4},
    {0x85, "TUPLE1", "a tuple", Operand::kNone},
    {0x86, "TUPLE2", "a tuple", Operand::kNone},
    {0x87, "TUPLE3", "a tuple", Operand::kNone},
    {0x88, "NEWTRUE", nullptr, Operand::kNone},
    {0x89, "NEWFALSE", nullptr, Operand::kNone},
    {0x8a, "LONG1", nullptr, Operand::kLong1},
    {0x8b, "LONG4", "an int of more than 255 bytes", Operand::kBytes, 4},
    {0x8c, "SHORT_BINUNICODE", nullptr, Operand::kText, 1},
    {0x8d, "BINUNICODE8", "a string over 4 GiB", Operand::kText, 8},
    {0x8e, "BINBYTES8", "a bytes object", Operand::kBytes, 8},
    {0x8f, "EMPTY_SET", "a set", Operand::kNone},
    {0x90, "ADDITEMS", "a set", Operand::kNone},
    {0x91, "FROZENSET", "a set", Operand::kNone},
    {0x92, "NEWOBJ_EX", "an object", Operand::kNone},
    {0x93, "STACK_GLOBAL", "an import of a Python object", Operand::kNone},
    {0x94, "MEMOIZE", nullptr, Operand::kNone},
    {0x95, "FRAME", nullptr, Operand::kUInt, 8},
    {0x96, "BYTEARRAY8", "a bytearray", Operand::kBytes, 8},
    {0x97, "NEXT_BUFFER", "an out-of-band buffer", Operand::kNone},
    {0x98, "READONLY_BUFFER", "an out-of-band buffer", Operand::kNone},
};

// kOpcodes indexed by code (nullptr for a byte that is no opcode): every opcode read looks its
// operand up here, so the lookup must not scan the table.
constexpr std::array<const OpcodeInfo*, 256> make_opcode_index() {
  std::array<const OpcodeInfo*, 256> index{};
  for (const OpcodeInfo& info : kOpcodes) index[info.code] = &info;
  return index;
}
constexpr std::array<const OpcodeInfo*, 256> kOpcodeIndex = make_opcode_index();

// "opcode 0x51 (BINPERSID, a tensor record)": why a reader refuses it, where the table knows.
std::string describe_refused(unsigned char code) {
  const OpcodeInfo* info = kOpcodeIndex[code];
  if (info == nullptr || info->builds == nullptr) return describe_pickle_opcode(code);
  return "opcode " + hex(code, 2) + " (" + info->name + ", " + info->builds + ")";
}

// The offset of the first byte of `text` that is not well-formed UTF-8 (what Python's unpickler
// decodes strings with), or text.size().
std::size_t utf8_error_offset(std::string_view text) {
  std::size_t k = 0;
  while (k < text.size()) {
    const auto c = static_cast<unsigned char>(text[k]);
    std::size_t extra = 0;
    unsigned char low = 0x80, high = 0xbf;  // range of the second byte
    if (c < 0x80) {
      ++k;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      extra = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      extra = 2;
      if (c == 0xe0) low = 0xa0;
      if (c == 0xed) high = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      extra = 3;
      if (c == 0xf0) low = 0x90;
      if (c == 0xf4) high = 0x8f;
    } else {
      return k;
    }
    if (text.size() - k <= extra) return k;
    for (std::size_t j = 1; j <= extra; ++j) {
      const auto next = static_cast<unsigned char>(text[k + j]);
      const unsigned char lo = j == 1 ? low : 0x80, hi = j == 1 ? high : 0xbf;
      if (next < lo || next > hi) return k;
    }
    k += extra + 1;
  }
  return k;
}

}  // namespace

std::string describe_pickle_opcode(unsigned char code) {
  const OpcodeInfo* info = kOpcodeIndex[code];
  if (info == nullptr) return "byte " + hex(code, 2) + " (not a pickle opcode)";
  return "opcode " + hex(code, 2) + " (" + info->name + ")";
}

PickleOp PickleCursor::next() {
  if (data_.empty()) fail_at(0, "the entry is empty; it should hold a pickle");
  while (true) {
    if (pos_ == data_.size()) {
      fail_at(pos_, "the pickle ends without STOP (0x2e); the pickle is truncated");
    }
    PickleOp op;
    op.at = pos_;
    op.code = static_cast<unsigned char>(data_[pos_++]);
    if (op.at == 0 && op.code != opcode::kProto) {
      fail_at(0, "the pickle starts with ", describe_pickle_opcode(op.code),
              " instead of PROTO (0x80) with protocol 2 to 5, as torch.save and LibTorch write");
    }
    if (op.code != opcode::kProto && !accepted_[op.code]) {
      fail_at(op.at, describe_refused(op.code), " ", refusal_);
    }
    decode(op);
    if (op.code == opcode::kProto) {
      if (op.at != 0) fail_at(op.at, "PROTO appears again after the start of the pickle");
      if (op.number < 2 || op.number > 5) {
        fail_at(op.at, "pickle protocol ", op.number,
                " is not one torch.save or LibTorch writes (2 to 5)");
      }
      continue;
    }
    if (op.code == opcode::kStop && pos_ != data_.size()) {
      fail_at(pos_, "the pickle goes on for ", data_.size() - pos_,
              " more byte(s) after STOP (at byte ", op.at, "); STOP must be its last byte");
    }
    return op;
  }
}

std::string_view PickleCursor::take(const PickleOp& op, std::uint64_t n) {
  if (remaining() < n) {
    fail_at(op.at, describe_pickle_opcode(op.code), " needs ", n,
            " argument bytes but the pickle ends after ", remaining(), "; the pickle is truncated");
  }
  const std::string_view bytes = data_.substr(pos_, static_cast<std::size_t>(n));
  pos_ += bytes.size();
  return bytes;
}

std::uint64_t PickleCursor::take_le(const PickleOp& op, int width) {
  const std::string_view bytes = take(op, static_cast<std::uint64_t>(width));
  std::uint64_t value = 0;
  for (int k = width - 1; k >= 0; --k) {
    value = (value << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(k)]);
  }
  return value;
}

std::string_view PickleCursor::take_line(const PickleOp& op) {
  const std::size_t newline = data_.substr(pos_, kMaxPickleLineLength + 1).find('\n');
  if (newline == std::string_view::npos) {
    fail_at(op.at, describe_pickle_opcode(op.code), " has no newline within ", kMaxPickleLineLength,
            " bytes to end its argument");
  }
  const std::string_view line = data_.substr(pos_, newline);
  pos_ += newline + 1;
  return line;
}

void PickleCursor::decode(PickleOp& op) {
  const OpcodeInfo& info = *kOpcodeIndex[op.code];
  switch (info.operand) {
    case Operand::kNone:
      return;
    case Operand::kUInt:
      op.number = take_le(op, info.width);
      op.integer = static_cast<std::int64_t>(op.number);
      return;
    case Operand::kInt4:
      op.integer = static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(op, 4)));
      return;
    case Operand::kFloat8: {
      std::uint64_t bits = 0;
      for (char c : take(op, 8)) bits = (bits << 8) | static_cast<unsigned char>(c);  // big-endian
      std::memcpy(&op.real, &bits, sizeof op.real);
      return;
    }
    case Operand::kLong1: {
      const auto width = static_cast<int>(take_le(op, 1));
      if (width > 8) {
        fail_at(op.at, "LONG1 holds an int of ", width,
                " bytes, which does not fit int64 (8 bytes)");
      }
      std::uint64_t bits = width == 0 ? 0 : take_le(op, width);
      if (width > 0 && width < 8 && (bits >> (8 * width - 1)) & 1u) {
        bits |= ~std::uint64_t{0} << (8 * width);  // two's complement: extend the sign
      }
      op.integer = static_cast<std::int64_t>(bits);
      return;
    }
    case Operand::kBytes:
    case Operand::kText: {
      op.number = take_le(op, info.width);
      op.text = take(op, op.number);
      const std::size_t bad =
          info.operand == Operand::kText ? utf8_error_offset(op.text) : op.text.size();
      if (bad != op.text.size()) {
        fail_at(op.at, "the string ", quoted(op.text), " is not valid UTF-8 (its byte ", bad, ")");
      }
      return;
    }
    case Operand::kLine:
      op.text = take_line(op);
      return;
    case Operand::kTwoLines:
      op.text = take_line(op);
      op.text2 = take_line(op);
      return;
  }
}

}  // namespace amp::detail
