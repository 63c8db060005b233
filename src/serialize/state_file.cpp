// The GradScaler state-file reader: the archive layout checks of a torch.save zip, then a pickle
// evaluator limited to a flat dict of numbers (see state_file.h for what is accepted and why).
#include "serialize/state_file.h"

#include <cstdint>
#include <map>
#include <set>

#include "serialize/pickle_cursor.h"
#include "serialize/zip_directory.h"

namespace amp::detail {

namespace {

using namespace opcode;

// What a state dict's pickle may hold; any other opcode is refused where it stands.
constexpr PickleOpcodeSet kStateOpcodes = pickle_opcodes(
    {kMark,    kStop,       kBinFloat, kBinInt,          kBinInt1, kBinInt2,  kBinUnicode,
     kBinGet,  kLongBinGet, kBinPut,   kLongBinPut,      kSetItem, kSetItems, kEmptyDict,
     kNewTrue, kNewFalse,   kLong1,    kShortBinUnicode, kMemoize, kFrame});

// A stack item: the dict, a MARK, a key string (a view into the pickle) or a number.
struct Item {
  enum class Kind { kMarker, kDict, kString, kNumber };
  Kind kind;
  std::size_t offset;  // of the opcode that pushed it
  std::string_view text;
  StateValue value;
};

const char* kind_name(const Item& item) {
  // In the order of Item::Kind (but kNumber) and of StateValue::Kind.
  constexpr const char* kItemNames[] = {"a MARK", "the dict itself", "a string"};
  constexpr const char* kValueNames[] = {"a float", "an int", "a bool"};
  if (item.kind != Item::Kind::kNumber) return kItemNames[static_cast<int>(item.kind)];
  return kValueNames[static_cast<int>(item.value.kind)];
}

// The dict, a MARK and at most kMaxStateEntries keys and values are ever pending.
constexpr std::size_t kMaxStackItems = 2 * kMaxStateEntries + 2;

class PickleReader : PickleCursor {
 public:
  PickleReader(std::string_view data, std::string_view entry_name)
      : PickleCursor(data, entry_name, kStateOpcodes,
                     "is not allowed in a GradScaler state file; a state dict holds only numbers") {
  }

  StateEntries run() {
    while (!step(next())) {
    }
    return std::move(entries_);
  }

 private:
  void push(Item item, unsigned char op) {
    if (!have_dict_) {
      fail_at(item.offset, describe_pickle_opcode(op),
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

  void push_string(const PickleOp& op) {
    if (op.text.size() > kMaxStateKeyLength) {
      fail_at(op.at, describe_pickle_opcode(op.code), " holds a string of ", op.text.size(),
              " bytes; state dict keys are at most ", kMaxStateKeyLength, " bytes");
    }
    push(Item{Item::Kind::kString, op.at, op.text, {}}, op.code);
  }

  void memoize(std::size_t at, unsigned char op, std::uint64_t index) {
    if (index >= kMaxPickleMemoIndex) {
      fail_at(at, describe_pickle_opcode(op), " uses memo index ", index,
              "; a state file uses indices below ", kMaxPickleMemoIndex);
    }
    if (stack_.empty() || stack_.back().kind == Item::Kind::kMarker) {
      fail_at(at, describe_pickle_opcode(op), " has nothing to store: ",
              stack_.empty() ? "the stack is empty" : "the top of the stack is a MARK");
    }
    memo_[index] = stack_.back();
  }

  void recall(std::size_t at, unsigned char op, std::uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) {
      fail_at(at, describe_pickle_opcode(op), " fetches memo index ", index,
              ", which nothing was stored at");
    }
    if (it->second.kind == Item::Kind::kDict) {
      fail_at(at, describe_pickle_opcode(op),
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
      fail_at(value.offset, "the value of key ", quoted(key.text), " is ", kind_name(value),
              "; a state dict holds only numbers (float, int, bool)");
    }
    if (!keys_.insert(key.text).second) {
      fail_at(key.offset, "key ", quoted(key.text), " appears twice in the dict");
    }
    if (entries_.size() >= kMaxStateEntries) {
      fail_at(key.offset, "the dict has more than ", kMaxStateEntries,
              " entries; a state dict has a few");
    }
    entries_.emplace_back(std::string(key.text), value.value);
  }

  // Executes `op`; returns true at STOP.
  bool step(const PickleOp& op) {
    const std::size_t at = op.at;
    switch (op.code) {
      case kFrame:
        if (op.number > remaining()) {
          fail_at(at, "FRAME announces ", op.number, " bytes but only ", remaining(),
                  " follow; the pickle is truncated");
        }
        return false;
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
      case kShortBinUnicode:
        push_string(op);
        return false;
      case kBinFloat: {
        StateValue v;
        v.kind = StateValue::Kind::kFloat;
        v.f = op.real;
        push_number(at, op.code, v);
        return false;
      }
      case kBinInt:
      case kBinInt1:
      case kBinInt2:
      case kLong1:
        push_int(at, op.code, op.integer);
        return false;
      case kNewTrue:
      case kNewFalse: {
        StateValue v;
        v.kind = StateValue::Kind::kBool;
        v.b = op.code == kNewTrue;
        push_number(at, op.code, v);
        return false;
      }
      case kBinPut:
      case kLongBinPut:
        memoize(at, op.code, op.number);
        return false;
      case kMemoize:
        memoize(at, op.code, memo_.size());
        return false;
      case kBinGet:
      case kLongBinGet:
        recall(at, op.code, op.number);
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
      default:  // not in kStateOpcodes: next() has refused it
        return false;
    }
  }

  bool have_dict_ = false;
  std::vector<Item> stack_;
  std::map<std::uint64_t, Item> memo_;
  std::set<std::string_view> keys_;
  StateEntries entries_;
};

}  // namespace

StateEntries parse_state_file(std::string_view bytes) {
  if (bytes.size() > kMaxStateFileSize) {
    fail_at(kWholeFile, kMaxStateFileSize, "the file is ", bytes.size(),
            " bytes; a GradScaler state file is at most ", kMaxStateFileSize, " bytes");
  }
  const ArchiveDirectory archive = read_archive_directory(bytes, kMaxZipEntries);
  for (const ZipEntry& entry : archive.entries) {
    if (entry.method != 0) {
      fail_at(kWholeFile, entry.record_offset, "zip entry ", quoted(entry.name),
              " is compressed (method ", entry.method, ", ", entry.compressed_size,
              " bytes stored for ", entry.size, "); torch.save stores entries uncompressed");
    }
  }
  const ZipEntry& pickle = archive.entries[archive.by_name.at("data.pkl")];
  std::string unused;  // stored entries are read in place, never inflated
  const std::string_view data =
      entry_bytes(bytes, pickle, kMaxStatePickleSize, "a state dict's pickle", unused);
  return parse_state_pickle(data, pickle.name);
}

StateEntries parse_state_pickle(std::string_view pickle, std::string_view entry_name) {
  return PickleReader(pickle, entry_name).run();
}

}  // namespace amp::detail
