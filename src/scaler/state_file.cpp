// The strict GradScaler state-file reader: zip directory checks and a pickle evaluator limited to
// a flat dict of numbers (see state_file.h for what is accepted and why).
#include "scaler/state_file.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

namespace amp::detail {

namespace {

// ---- helpers ----

// Names and entry names come from the file: show them printable and short, so a message never
// carries control bytes or kilobytes of attacker text.
std::string printable(std::string_view text) {
  constexpr std::size_t kMaxShown = 64;
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  for (std::size_t k = 0; k < text.size() && k < kMaxShown; ++k) {
    const auto c = static_cast<unsigned char>(text[k]);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out;
}

std::string quoted_text(std::string_view text) { return "'" + printable(text) + "'"; }

std::string hex(std::uint64_t value, int digits) {
  static const char* const kHex = "0123456789abcdef";
  std::string out(static_cast<std::size_t>(digits), '0');
  for (int k = digits - 1; k >= 0; --k, value >>= 4) {
    out[static_cast<std::size_t>(k)] = kHex[value & 0xf];
  }
  return "0x" + out;
}

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

constexpr std::array<std::uint32_t, 256> make_crc32_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    std::uint32_t c = n;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}
constexpr std::array<std::uint32_t, 256> kCrc32Table = make_crc32_table();

// ---- zip ----

constexpr std::uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr std::uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr std::uint32_t kEndOfCentralDirSignature = 0x06054b50;
constexpr std::uint32_t kZip64EndOfCentralDirSignature = 0x06064b50;
constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr std::uint64_t kEndOfCentralDirSize = 22;
constexpr std::uint64_t kZip64EndOfCentralDirSize = 56;
constexpr std::uint64_t kZip64LocatorSize = 20;
constexpr std::uint64_t kCentralHeaderSize = 46;
constexpr std::uint64_t kLocalHeaderSize = 30;
constexpr std::uint64_t kMaxZipComment = 0xffff;

// The end-of-central-directory record: the last one whose comment length reaches exactly the end
// of the file (a comment may itself contain the signature's bytes).
std::uint64_t find_end_of_central_dir(std::string_view file) {
  const std::uint64_t size = file.size();
  if (size < kEndOfCentralDirSize) {
    reject("the file is ", size, " bytes, too short for a zip archive (at least ",
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
  reject("no zip end-of-central-directory record in the last ", size - lowest,
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
    reject("the ZIP64 end-of-central-directory locator at byte ", locator,
           " names another disk; multi-disk archives are not supported");
  }
  if (record > locator || locator - record < kZip64EndOfCentralDirSize) {
    reject("the ZIP64 end-of-central-directory locator at byte ", locator, " points to byte ",
           record, ", which leaves no room for a ZIP64 record before the locator");
  }
  if (u32(file, record) != kZip64EndOfCentralDirSignature) {
    reject("the ZIP64 end-of-central-directory locator at byte ", locator, " points to byte ",
           record, ", where there is no ZIP64 end-of-central-directory record");
  }
  const bool agrees = u32(file, record + 16) == 0 && u32(file, record + 20) == 0 &&
                      u64(file, record + 24) == entries && u64(file, record + 32) == entries &&
                      u64(file, record + 40) == dir_size && u64(file, record + 48) == dir_offset;
  if (!agrees) {
    reject("the ZIP64 end-of-central-directory record at byte ", record,
           " disagrees with the end-of-central-directory record at byte ", eocd, " (",
           u64(file, record + 32), " entries, directory of ", u64(file, record + 40),
           " bytes at byte ", u64(file, record + 48), " against ", entries, " entries, ", dir_size,
           " bytes at byte ", dir_offset, ")");
  }
  return record;
}

// The entry's local header must agree with its central record; returns where its data starts.
std::uint64_t check_local_header(std::string_view file, const ZipEntry& entry, std::uint64_t local,
                                 std::uint64_t dir_offset, std::uint16_t flags) {
  const std::string name = quoted_text(entry.name);
  if (local > dir_offset || dir_offset - local < kLocalHeaderSize) {
    reject("zip entry ", name, ": its local header at byte ", local,
           " is not before the central directory (byte ", dir_offset, ")");
  }
  if (u32(file, local) != kLocalHeaderSignature) {
    reject("zip entry ", name, ": no local header signature at byte ", local);
  }
  const std::uint64_t name_length = u16(file, local + 26);
  const std::uint64_t extra_length = u16(file, local + 28);
  const std::uint64_t data = local + kLocalHeaderSize + name_length + extra_length;
  if (data > dir_offset) {
    reject("zip entry ", name, ": its local header at byte ", local,
           " runs into the central directory (byte ", dir_offset, ")");
  }
  if (file.substr(local + kLocalHeaderSize, name_length) != entry.name) {
    reject("zip entry ", name, ": its local header at byte ", local, " names it ",
           quoted_text(file.substr(local + kLocalHeaderSize, name_length)));
  }
  if (u16(file, local + 8) != entry.method) {
    reject("zip entry ", name, ": its local header at byte ", local, " gives method ",
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
    reject("zip entry ", name, ": its local header at byte ", local, " gives CRC ", hex(crc, 8),
           " and sizes ", compressed, "/", size, " but the central directory gives ",
           hex(entry.crc32, 8), " and ", entry.compressed_size, "/", entry.size);
  }
  if (data + entry.compressed_size > dir_offset) {
    reject("zip entry ", name, ": its ", entry.compressed_size, " bytes of data at byte ", data,
           " run past the start of the central directory (byte ", dir_offset, ")");
  }
  return data;
}

// ---- pickle ----

constexpr unsigned char kMark = 0x28, kStop = 0x2e, kBinFloat = 0x47, kBinInt = 0x4a,
                        kBinInt1 = 0x4b, kBinInt2 = 0x4d, kBinUnicode = 0x58, kBinGet = 0x68,
                        kLongBinGet = 0x6a, kBinPut = 0x71, kLongBinPut = 0x72, kSetItem = 0x73,
                        kSetItems = 0x75, kEmptyDict = 0x7d, kProto = 0x80, kNewTrue = 0x88,
                        kNewFalse = 0x89, kLong1 = 0x8a, kShortBinUnicode = 0x8c, kMemoize = 0x94,
                        kFrame = 0x95;

// Every opcode of pickle protocols 0 to 5, to name a refused one.
struct OpcodeName {
  unsigned char code;
  const char* name;
  const char* what;  // what it would build, for the ones a damaged state file is likely to hold
};
constexpr OpcodeName kOpcodeNames[] = {
    {0x28, "MARK", nullptr},
    {0x29, "EMPTY_TUPLE", "a tuple"},
    {0x2e, "STOP", nullptr},
    {0x30, "POP", nullptr},
    {0x31, "POP_MARK", nullptr},
    {0x32, "DUP", nullptr},
    {0x42, "BINBYTES", "a bytes object"},
    {0x43, "SHORT_BINBYTES", "a bytes object"},
    {0x46, "FLOAT", "a text float"},
    {0x47, "BINFLOAT", nullptr},
    {0x49, "INT", "a text int"},
    {0x4a, "BININT", nullptr},
    {0x4b, "BININT1", nullptr},
    {0x4c, "LONG", "a text int"},
    {0x4d, "BININT2", nullptr},
    {0x4e, "NONE", "None"},
    {0x50, "PERSID", "a tensor record"},
    {0x51, "BINPERSID", "a tensor record"},
    {0x52, "REDUCE", "a call of a Python object"},
    {0x53, "STRING", "a text string"},
    {0x54, "BINSTRING", "a byte string"},
    {0x55, "SHORT_BINSTRING", "a byte string"},
    {0x56, "UNICODE", "a text string"},
    {0x58, "BINUNICODE", nullptr},
    {0x5d, "EMPTY_LIST", "a list"},
    {0x61, "APPEND", "a list"},
    {0x62, "BUILD", "an object's state"},
    {0x63, "GLOBAL", "an import of a Python object"},
    {0x64, "DICT", "a dict from text pickles"},
    {0x65, "APPENDS", "a list"},
    {0x67, "GET", nullptr},
    {0x68, "BINGET", nullptr},
    {0x69, "INST", "an object"},
    {0x6a, "LONG_BINGET", nullptr},
    {0x6c, "LIST", "a list"},
    {0x6f, "OBJ", "an object"},
    {0x70, "PUT", nullptr},
    {0x71, "BINPUT", nullptr},
    {0x72, "LONG_BINPUT", nullptr},
    {0x73, "SETITEM", nullptr},
    {0x74, "TUPLE", "a tuple"},
    {0x75, "SETITEMS", nullptr},
    {0x7d, "EMPTY_DICT", nullptr},
    {0x80, "PROTO", nullptr},
    {0x81, "NEWOBJ", "an object"},
    {0x82, "EXT1", "an import of a Python object"},
    {0x83, "EXT2", "an import of a Python object"},
    {0x84, "EXT4", "an import of a Python object"},
    {0x85, "TUPLE1", "a tuple"},
    {0x86, "TUPLE2", "a tuple"},
    {0x87, "TUPLE3", "a tuple"},
    {0x88, "NEWTRUE", nullptr},
    {0x89, "NEWFALSE", nullptr},
    {0x8a, "LONG1", nullptr},
    {0x8b, "LONG4", "an int of more than 255 bytes"},
    {0x8c, "SHORT_BINUNICODE", nullptr},
    {0x8d, "BINUNICODE8", "a string over 4 GiB"},
    {0x8e, "BINBYTES8", "a bytes object"},
    {0x8f, "EMPTY_SET", "a set"},
    {0x90, "ADDITEMS", "a set"},
    {0x91, "FROZENSET", "a set"},
    {0x92, "NEWOBJ_EX", "an object"},
    {0x93, "STACK_GLOBAL", "an import of a Python object"},
    {0x94, "MEMOIZE", nullptr},
    {0x95, "FRAME", nullptr},
    {0x96, "BYTEARRAY8", "a bytearray"},
    {0x97, "NEXT_BUFFER", "an out-of-band buffer"},
    {0x98, "READONLY_BUFFER", "an out-of-band buffer"},
};

const OpcodeName* find_opcode(unsigned char code) {
  for (const OpcodeName& op : kOpcodeNames) {
    if (op.code == code) return &op;
  }
  return nullptr;
}

// "opcode 0x51 (BINPERSID)", or "byte 0xff (not a pickle opcode)".
std::string describe(unsigned char code) {
  const OpcodeName* op = find_opcode(code);
  if (op == nullptr) return "byte " + hex(code, 2) + " (not a pickle opcode)";
  return "opcode " + hex(code, 2) + " (" + op->name + ")";
}

// Whether `text` is well-formed UTF-8 (what Python's unpickler decodes keys with); returns the
// offset of the first bad byte, or text.size().
std::size_t utf8_error(std::string_view text) {
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

// A stack item: the dict, a MARK, a key string (a view into the pickle) or a number.
struct Item {
  enum class Kind { kMarker, kDict, kString, kNumber };
  Kind kind;
  std::size_t offset;  // of the opcode that pushed it
  std::string_view text;
  StateValue value;
};

const char* kind_name(const Item& item) {
  switch (item.kind) {
    case Item::Kind::kMarker:
      return "a MARK";
    case Item::Kind::kDict:
      return "the dict itself";
    case Item::Kind::kString:
      return "a string";
    case Item::Kind::kNumber:
      switch (item.value.kind) {
        case StateValue::Kind::kFloat:
          return "a float";
        case StateValue::Kind::kInt:
          return "an int";
        case StateValue::Kind::kBool:
          return "a bool";
      }
  }
  return "a value";
}

// The dict, a MARK and at most kMaxStateEntries keys and values are ever pending.
constexpr std::size_t kMaxStackItems = 2 * kMaxStateEntries + 2;

class PickleReader : PickleCursor {
 public:
  PickleReader(std::string_view data, std::string_view entry_name)
      : PickleCursor(data, entry_name, "the file is truncated") {}

  StateEntries run() {
    if (data_.empty()) reject(entry_name_, " is empty; it should hold the pickled state dict");
    while (pos_ < data_.size()) {
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(data_[pos_++]);
      if (at == 0 && op != kProto) {
        fail_at(at, "the pickle starts with ", describe(op),
                " instead of PROTO (0x80) with protocol 2 to 5, as torch.save writes");
      }
      if (step(at, op)) {
        if (pos_ != data_.size()) {
          fail_at(pos_, "the pickle goes on for ", data_.size() - pos_,
                  " more byte(s) after STOP (at byte ", at, "); STOP must be its last byte");
        }
        return std::move(entries_);
      }
    }
    fail_at(data_.size(), "the pickle ends without STOP (0x2e); the file is truncated");
  }

 private:
  void push(Item item, unsigned char op) {
    if (!have_dict_) {
      fail_at(item.offset, describe(op),
              " comes before the dict; the pickle must hold one dict, starting with EMPTY_DICT");
    }
    if (stack_.size() >= kMaxStackItems) {
      fail_at(item.offset, "more than ", kMaxStackItems - 2,
              " keys and values are pending; a state dict has at most ", kMaxStateEntries,
              " entries");
    }
    stack_.push_back(item);
  }
  void push_number(std::size_t at, unsigned char op, StateValue value) {
    push(Item{Item::Kind::kNumber, at, {}, value}, op);
  }
  void push_int(std::size_t at, unsigned char op, std::int64_t value) {
    StateValue v;
    v.kind = StateValue::Kind::kInt;
    v.i = value;
    push_number(at, op, v);
  }

  void push_string(std::size_t at, unsigned char op, std::uint64_t length) {
    if (length > kMaxStateKeyLength) {
      fail_at(at, describe(op), " announces a string of ", length,
              " bytes; state dict keys are at most ", kMaxStateKeyLength, " bytes");
    }
    const std::string_view text = take(at, op, static_cast<std::size_t>(length));
    const std::size_t bad = utf8_error(text);
    if (bad != text.size()) {
      fail_at(at, "the string ", quoted_text(text), " is not valid UTF-8 (its byte ", bad, ")");
    }
    push(Item{Item::Kind::kString, at, text, {}}, op);
  }

  void memoize(std::size_t at, unsigned char op, std::uint64_t index) {
    if (index >= kMaxPickleMemoIndex) {
      fail_at(at, describe(op), " uses memo index ", index, "; a state file uses indices below ",
              kMaxPickleMemoIndex);
    }
    if (stack_.empty() || stack_.back().kind == Item::Kind::kMarker) {
      fail_at(at, describe(op), " has nothing to store: ",
              stack_.empty() ? "the stack is empty" : "the top of the stack is a MARK");
    }
    memo_[index] = stack_.back();
  }

  void recall(std::size_t at, unsigned char op, std::uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) {
      fail_at(at, describe(op), " fetches memo index ", index, ", which nothing was stored at");
    }
    if (it->second.kind == Item::Kind::kDict) {
      fail_at(at, describe(op),
              " fetches the dict itself; a state dict holds only numbers, not itself");
    }
    Item item = it->second;
    item.offset = at;
    push(item, op);
  }

  void insert(const Item& key, const Item& value) {
    if (key.kind != Item::Kind::kString) {
      fail_at(key.offset, "a key is ", kind_name(key), ", not a string; state dict keys are ",
              "strings");
    }
    if (value.kind != Item::Kind::kNumber) {
      fail_at(value.offset, "the value of key ", quoted_text(key.text), " is ", kind_name(value),
              "; a state dict holds only numbers (float, int, bool)");
    }
    if (!keys_.insert(key.text).second) {
      fail_at(key.offset, "key ", quoted_text(key.text), " appears twice in the dict");
    }
    if (entries_.size() >= kMaxStateEntries) {
      fail_at(key.offset, "the dict has more than ", kMaxStateEntries,
              " entries; a state dict has a few");
    }
    entries_.emplace_back(std::string(key.text), value.value);
  }

  [[noreturn]] void refuse(std::size_t at, unsigned char op) const {
    const OpcodeName* name = find_opcode(op);
    std::string what = describe(op);
    if (name != nullptr && name->what != nullptr) {
      what = "opcode " + hex(op, 2) + " (" + name->name + ", " + name->what + ")";
    }
    fail_at(at, what,
            " is not allowed in a GradScaler state file; a state dict holds only numbers");
  }

  // Executes the opcode at `at`; returns true at STOP.
  bool step(std::size_t at, unsigned char op) {
    switch (op) {
      case kProto: {
        const auto version = static_cast<unsigned char>(take(at, op, 1)[0]);
        if (at != 0) fail_at(at, "PROTO appears again after the start of the pickle");
        if (version < 2 || version > 5) {
          fail_at(at, "pickle protocol ", static_cast<int>(version),
                  " is not one torch.save writes (2 to 5)");
        }
        return false;
      }
      case kFrame: {
        const std::uint64_t length = take_le(at, op, 8);
        if (length > data_.size() - pos_) {
          fail_at(at, "FRAME announces ", length, " bytes but only ", data_.size() - pos_,
                  " follow; the file is truncated");
        }
        return false;
      }
      case kEmptyDict:
        if (have_dict_) {
          fail_at(at, "a second dict (EMPTY_DICT); a state dict is one flat dict of numbers, ",
                  "with no nested dicts");
        }
        have_dict_ = true;
        stack_.push_back(Item{Item::Kind::kDict, at, {}, {}});
        return false;
      case kMark:
        if (!have_dict_) {
          fail_at(at, "MARK comes before the dict; the pickle must hold one dict, starting with ",
                  "EMPTY_DICT");
        }
        if (stack_.size() != 1) {
          fail_at(at, "MARK opens a second group while ", stack_.size() - 1,
                  " items are pending after the dict; a state dict is one flat dict filled by ",
                  "one MARK ... SETITEMS at a time");
        }
        stack_.push_back(Item{Item::Kind::kMarker, at, {}, {}});
        return false;
      case kBinUnicode:
        push_string(at, op, take_le(at, op, 4));
        return false;
      case kShortBinUnicode:
        push_string(at, op, take_le(at, op, 1));
        return false;
      case kBinFloat: {
        const std::string_view bytes = take(at, op, 8);
        std::uint64_t bits = 0;
        for (char c : bytes) bits = (bits << 8) | static_cast<unsigned char>(c);  // big-endian
        StateValue v;
        v.kind = StateValue::Kind::kFloat;
        std::memcpy(&v.f, &bits, sizeof(v.f));
        push_number(at, op, v);
        return false;
      }
      case kBinInt:
        push_int(at, op, static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(at, op, 4))));
        return false;
      case kBinInt1:
        push_int(at, op, static_cast<std::int64_t>(take_le(at, op, 1)));
        return false;
      case kBinInt2:
        push_int(at, op, static_cast<std::int64_t>(take_le(at, op, 2)));
        return false;
      case kLong1: {
        const auto length = static_cast<int>(take_le(at, op, 1));
        if (length > 8) {
          fail_at(at, "LONG1 holds an int of ", length,
                  " bytes, which does not fit int64 (8 bytes)");
        }
        std::uint64_t bits = length == 0 ? 0 : take_le(at, op, length);
        if (length > 0 && length < 8 && (bits >> (8 * length - 1)) & 1u) {
          bits |= ~std::uint64_t{0} << (8 * length);  // two's complement: extend the sign
        }
        push_int(at, op, static_cast<std::int64_t>(bits));
        return false;
      }
      case kNewTrue:
      case kNewFalse: {
        StateValue v;
        v.kind = StateValue::Kind::kBool;
        v.b = op == kNewTrue;
        push_number(at, op, v);
        return false;
      }
      case kBinPut:
        memoize(at, op, take_le(at, op, 1));
        return false;
      case kLongBinPut:
        memoize(at, op, take_le(at, op, 4));
        return false;
      case kMemoize:
        memoize(at, op, memo_.size());
        return false;
      case kBinGet:
        recall(at, op, take_le(at, op, 1));
        return false;
      case kLongBinGet:
        recall(at, op, take_le(at, op, 4));
        return false;
      case kSetItem: {
        const std::size_t n = stack_.size();
        if (n < 3 || stack_[n - 3].kind != Item::Kind::kDict) {
          fail_at(at, "SETITEM needs the dict, a key and a value on the stack");
        }
        insert(stack_[n - 2], stack_[n - 1]);
        stack_.resize(n - 2);
        return false;
      }
      case kSetItems: {
        if (stack_.size() < 2 || stack_[1].kind != Item::Kind::kMarker) {
          fail_at(at, "SETITEMS without a MARK after the dict");
        }
        if ((stack_.size() - 2) % 2 != 0) {
          fail_at(at, "SETITEMS finds ", stack_.size() - 2, " items after the MARK at byte ",
                  stack_[1].offset, ": a key has no value");
        }
        for (std::size_t k = 2; k < stack_.size(); k += 2) insert(stack_[k], stack_[k + 1]);
        stack_.resize(1);
        return false;
      }
      case kStop:
        if (!have_dict_) fail_at(at, "STOP before any dict; the pickle must hold one dict");
        if (stack_.size() != 1) {
          const Item& extra = stack_[1];
          if (extra.kind == Item::Kind::kMarker) {
            fail_at(at, "STOP while the MARK at byte ", extra.offset, " is not closed by SETITEMS");
          }
          fail_at(at, "STOP leaves ", stack_.size() - 1,
                  " items unused after the dict (the first, ", kind_name(extra), ", at byte ",
                  extra.offset, ")");
        }
        return true;
      default:
        refuse(at, op);
    }
  }

  bool have_dict_ = false;
  std::vector<Item> stack_;
  std::map<std::uint64_t, Item> memo_;
  std::set<std::string_view> keys_;
  StateEntries entries_;
};

}  // namespace

std::uint32_t crc32(std::string_view bytes) {
  std::uint32_t c = 0xffffffffu;
  for (char byte : bytes)
    c = kCrc32Table[(c ^ static_cast<unsigned char>(byte)) & 0xffu] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::string_view PickleCursor::take(std::size_t at, unsigned char op, std::size_t n) {
  if (data_.size() - pos_ < n) {
    fail_at(at, describe(op), " needs ", n, " argument bytes but the pickle ends after ",
            data_.size() - pos_, "; ", truncated_);
  }
  const std::string_view bytes = data_.substr(pos_, n);
  pos_ += n;
  return bytes;
}

std::uint64_t PickleCursor::take_le(std::size_t at, unsigned char op, int width) {
  return read_le(take(at, op, static_cast<std::size_t>(width)), 0, width);
}

std::string printable_text(std::string_view text) { return printable(text); }
std::string describe_pickle_opcode(unsigned char code) { return describe(code); }
std::size_t utf8_error_offset(std::string_view text) { return utf8_error(text); }

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
    reject("the end-of-central-directory record at byte ", eocd, " has ZIP64 markers (entry count ",
           hex(entries, 4), ", directory size ", hex(dir_size, 8), ", directory offset ",
           hex(dir_offset, 8), "); ZIP64 archives are not supported");
  }
  if (disk != 0 || dir_disk != 0 || disk_entries != entries) {
    reject("the end-of-central-directory record at byte ", eocd,
           " describes a multi-disk archive (disk ", disk, ", directory on disk ", dir_disk, ", ",
           disk_entries, " of ", entries, " entries on this disk); only single-file zips are read");
  }
  if (entries > max_entries) {
    reject("the zip archive lists ", entries, " entries; at most ", max_entries, " are accepted");
  }
  const std::uint64_t dir_limit = check_zip64_records(file, eocd, entries, dir_size, dir_offset);
  const std::uint64_t dir_end = std::uint64_t{dir_offset} + dir_size;
  if (dir_end > dir_limit) {
    reject("the central directory (", dir_size, " bytes at byte ", dir_offset,
           ") runs past its end record at byte ", dir_limit);
  }
  if (std::uint64_t{entries} * kCentralHeaderSize > dir_size) {
    reject("the zip archive lists ", entries,
           " entries, which cannot fit in a central directory of ", dir_size, " bytes");
  }

  std::vector<ZipEntry> result;
  result.reserve(entries);
  std::uint64_t pos = dir_offset;
  for (std::uint32_t k = 0; k < entries; ++k) {
    if (dir_end - pos < kCentralHeaderSize) {
      reject("central directory record ", k, " at byte ", pos,
             " runs past the end of the central directory (byte ", dir_end, ")");
    }
    if (u32(file, pos) != kCentralHeaderSignature) {
      reject("no central directory record signature at byte ", pos, " (record ", k, ")");
    }
    const std::uint16_t flags = u16(file, pos + 8);
    const std::uint64_t name_length = u16(file, pos + 28);
    const std::uint64_t record_size =
        kCentralHeaderSize + name_length + u16(file, pos + 30) + u16(file, pos + 32);
    if (dir_end - pos < record_size) {
      reject("central directory record ", k, " at byte ", pos, " (", record_size,
             " bytes with its name, extra field and comment) runs past the end of the central ",
             "directory (byte ", dir_end, ")");
    }
    ZipEntry entry;
    entry.name = std::string(file.substr(pos + kCentralHeaderSize, name_length));
    if (name_length == 0 || name_length > kMaxZipNameLength ||
        entry.name.find('\0') != std::string::npos) {
      reject("central directory record ", k, " at byte ", pos, " has a name of ", name_length,
             " bytes", name_length == 0 ? "" : " containing NUL or too long",
             "; entry names are 1 to ", kMaxZipNameLength, " bytes without NUL");
    }
    if (flags & 0x41) {
      reject("zip entry ", quoted_text(entry.name), " is encrypted (flags ", hex(flags, 4),
             "); encrypted entries are not supported");
    }
    entry.method = u16(file, pos + 10);
    entry.crc32 = u32(file, pos + 16);
    entry.compressed_size = u32(file, pos + 20);
    entry.size = u32(file, pos + 24);
    const std::uint32_t local = u32(file, pos + 42);
    if (entry.compressed_size == 0xffffffffu || entry.size == 0xffffffffu || local == 0xffffffffu ||
        u16(file, pos + 34) == 0xffff) {
      reject("zip entry ", quoted_text(entry.name),
             " has ZIP64 markers in its central record at byte ", pos,
             "; ZIP64 archives are not supported");
    }
    if (u16(file, pos + 34) != 0) {
      reject("zip entry ", quoted_text(entry.name), " starts on disk ", u16(file, pos + 34),
             "; only single-file zips are read");
    }
    entry.data_offset = check_local_header(file, entry, local, dir_offset, flags);
    result.push_back(std::move(entry));
    pos += record_size;
  }
  if (pos != dir_end) {
    reject("the central directory has ", dir_end - pos, " bytes after its ", entries,
           " records (it should end at byte ", pos, ")");
  }
  return result;
}

StateEntries parse_state_file(std::string_view bytes) {
  if (bytes.size() > kMaxStateFileSize) {
    reject("the file is ", bytes.size(), " bytes; a GradScaler state file is at most ",
           kMaxStateFileSize, " bytes");
  }
  const std::vector<ZipEntry> entries = read_zip_directory(bytes);
  if (entries.empty()) reject("the zip archive has no entries; it should hold data.pkl");

  // torch.save puts every entry under one directory named after the file ("archive" in C++).
  const std::string& first = entries.front().name;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0) {
    reject("zip entry ", quoted_text(first),
           " is not inside a directory; torch.save puts every entry under one (like 'x/data.pkl')");
  }
  const std::string prefix = first.substr(0, slash + 1);
  std::vector<std::string_view> names;
  names.reserve(entries.size());
  const ZipEntry* pickle = nullptr;
  for (const ZipEntry& entry : entries) {
    if (entry.name.compare(0, prefix.size(), prefix) != 0) {
      reject("zip entry ", quoted_text(entry.name), " is outside the directory ",
             quoted_text(prefix),
             " that holds the first entry; torch.save puts every entry under one directory");
    }
    if (entry.method != 0 || entry.compressed_size != entry.size) {
      reject("zip entry ", quoted_text(entry.name), " is compressed (method ", entry.method, ", ",
             entry.compressed_size, " bytes stored for ", entry.size,
             "); torch.save stores entries uncompressed");
    }
    if (entry.name.size() == prefix.size() + 8 &&
        entry.name.compare(prefix.size(), 8, "data.pkl") == 0) {
      pickle = &entry;
    }
    names.push_back(entry.name);
  }
  std::sort(names.begin(), names.end());
  const auto twice = std::adjacent_find(names.begin(), names.end());
  if (twice != names.end())
    reject("zip entry ", quoted_text(*twice), " appears twice in the archive");
  if (pickle == nullptr) {
    reject("the zip archive has no entry ", quoted_text(prefix + "data.pkl"),
           "; it holds something other than a torch.save state dict");
  }
  if (pickle->size > kMaxStatePickleSize) {
    reject("zip entry ", quoted_text(pickle->name), " is ", pickle->size,
           " bytes; a state dict's pickle is at most ", kMaxStatePickleSize, " bytes");
  }
  const std::string_view data = bytes.substr(pickle->data_offset, pickle->size);
  const std::uint32_t crc = crc32(data);
  if (crc != pickle->crc32) {
    reject("zip entry ", quoted_text(pickle->name), " has CRC-32 ", hex(crc, 8),
           " but the archive records ", hex(pickle->crc32, 8), "; its bytes are damaged");
  }
  return parse_state_pickle(data, pickle->name);
}

StateEntries parse_state_pickle(std::string_view pickle, std::string_view entry_name) {
  return PickleReader(pickle, entry_name).run();
}

}  // namespace amp::detail
