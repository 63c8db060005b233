// The archive checker's pickle part: a scanner that evaluates the kinds and nesting (not the
// values) of what LibTorch's pickler writes, and the tensor records' bounds (archive_check.h).
#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "serialize/archive_check.h"
#include "serialize/archive_text.h"
#include "serialize/pickle_cursor.h"

namespace amp::detail {

namespace {

using namespace opcode;
using namespace archive_text;

// ---- pickles ----

// What LibTorch's pickler writes; any other opcode is refused where it stands.
constexpr PickleOpcodeSet kArchiveOpcodes = pickle_opcodes(
    {kMark,    kEmptyTuple, kStop,      kBinFloat,        kBinInt,    kBinInt1,    kBinInt2,
     kNone,    kBinPersId,  kReduce,    kBinUnicode,      kEmptyList, kAppend,     kBuild,
     kGlobal,  kAppends,    kBinGet,    kLongBinGet,      kBinPut,    kLongBinPut, kSetItem,
     kTuple,   kSetItems,   kEmptyDict, kNewObj,          kTuple1,    kTuple2,     kTuple3,
     kNewTrue, kNewFalse,   kLong1,     kShortBinUnicode, kMemoize,   kFrame});

// Storage types LibTorch saves tensors with, and their element sizes.
struct StorageType {
  const char* name;
  std::uint64_t element_size;
};
constexpr StorageType kStorageTypes[] = {
    {"FloatStorage", 4},    {"DoubleStorage", 8},       {"HalfStorage", 2},
    {"BFloat16Storage", 2}, {"LongStorage", 8},         {"IntStorage", 4},
    {"ShortStorage", 2},    {"CharStorage", 1},         {"ByteStorage", 1},
    {"BoolStorage", 1},     {"ComplexFloatStorage", 8}, {"ComplexDoubleStorage", 16},
};

// The dtypes torch.save names itself (torch.<dtype>, an argument of _rebuild_tensor_v3) because
// they have no <X>Storage type, and their element sizes.
constexpr StorageType kSavedDtypes[] = {
    {"float8_e4m3fn", 1},  {"float8_e5m2", 1}, {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1},
    {"float8_e8m0fnu", 1}, {"uint16", 2},      {"uint32", 4},          {"uint64", 8},
};

// What a GLOBAL names; the scanner accepts nothing else.
enum class Callable {
  kNone,
  kClass,             // a __torch__ class (NEWOBJ)
  kStorage,           // torch.<X>Storage or torch.storage.UntypedStorage (in a tensor record)
  kDtype,             // torch.<dtype> (_rebuild_tensor_v3's last argument)
  kRebuildTensor,     // torch._utils._rebuild_tensor_v2
  kRebuildTensorV3,   // torch._utils._rebuild_tensor_v3 (Python's torch.save, float8 dtypes)
  kRebuildParameter,  // torch._utils._rebuild_parameter[_with_state] (an nn.Parameter, torch.save)
  kOrderedDict,       // collections.OrderedDict
  kBuildList,         // torch.jit._pickle.build_{int,double,bool,tensor}list
  kRestoreTypeTag,    // torch.jit._pickle.restore_type_tag
};

struct Node;

// A value on the scanner's stack: its kind and what later checks need of it.
struct Value {
  enum class Kind {
    kMark,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kGlobal,
    kTuple,
    kList,
    kDict,
    kObject,
    kStorage,
    kTensor
  };
  Kind kind = Kind::kNone;
  std::int64_t integer = 0;  // kInt; kBool as 0/1
  std::string_view text;     // kString
  Callable callable = Callable::kNone;
  std::uint64_t element_size = 0;  // kGlobal of a storage type; kStorage
  std::uint64_t numel = 0;         // kStorage
  bool untyped = false;            // kGlobal of UntypedStorage; kStorage made with it
  std::shared_ptr<Node> node;      // containers: shared by every copy (memo, stack)
};

// A container's bookkeeping, shared by all references to it.
struct Node {
  std::size_t depth = 1;      // 1 + the deepest value inside
  bool contained = false;     // placed inside another container: must not change any more
  std::vector<Value> items;   // a tuple's items, when it has at most kMaxKeptItems
  std::size_t size = 0;       // a tuple's item count
  bool ordered_dict = false;  // a dict made by OrderedDict(), which BUILD may give attributes
};

// Tuples up to this size keep their items (tensor records, sizes and strides, call arguments).
constexpr std::size_t kMaxKeptItems = kMaxArchiveTensorDims;

// What each Value::Kind is called in messages, in the enum's order.
constexpr const char* kKindNames[] = {
    "a MARK",  "None",   "a bool", "an int",    "a float",          "a string", "an imported name",
    "a tuple", "a list", "a dict", "an object", "a tensor storage", "a tensor"};
static_assert(std::size(kKindNames) == static_cast<std::size_t>(Value::Kind::kTensor) + 1);

const char* kind_name(Value::Kind kind) { return kKindNames[static_cast<std::size_t>(kind)]; }

// A value that holds no container: a bool or int (`integer`), a float, a string (`text`).
Value scalar(Value::Kind kind, std::int64_t integer = 0, std::string_view text = {}) {
  Value value;
  value.kind = kind;
  value.integer = integer;
  value.text = text;
  return value;
}

std::size_t depth_of(const Value& value) { return value.node ? value.node->depth : 0; }

class ArchivePickleScanner : PickleCursor {
 public:
  ArchivePickleScanner(std::string_view data, std::string_view entry_name,
                       const ArchiveRecordSize& record_size)
      : PickleCursor(data, entry_name, kArchiveOpcodes,
                     "is not used by LibTorch's archives; the entry is damaged or was not written "
                     "by LibTorch"),
        record_size_(record_size) {}

  void run() {
    while (true) {
      const PickleOp op = next();
      if (op.code == kStop) {
        if (stack_.size() != 1 || !marks_.empty()) {
          fail_at(op.at, "STOP with ", stack_.size(), " value(s) and ", marks_.size(),
                  " open MARK(s) on the stack; a pickle ends with exactly one value");
        }
        return;
      }
      step(op);
    }
  }

 private:
  void push(std::size_t at, Value value) {
    if (marks_.size() + depth_of(value) > kMaxArchiveNesting) {
      fail_at(at, "values nest more than ", kMaxArchiveNesting,
              " deep; LibTorch's reader would recurse that deep");
    }
    stack_.push_back(std::move(value));
  }
  Value pop(std::size_t at, unsigned char op) {
    if (stack_.size() <= stack_floor()) {
      fail_at(at, describe_pickle_opcode(op), " needs a value but the stack is empty",
              marks_.empty() ? "" : " above the last MARK");
    }
    Value value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }
  std::size_t stack_floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The values since the last MARK, which is removed.
  std::vector<Value> pop_mark(std::size_t at, unsigned char op) {
    return PickleCursor::pop_mark(stack_, marks_, at, op);
  }
  Value& top(std::size_t at, unsigned char op) {
    if (stack_.size() <= stack_floor()) {
      fail_at(at, describe_pickle_opcode(op), " needs a value but the stack is empty");
    }
    return stack_.back();
  }

  Value container(Value::Kind kind) {
    Value value;
    value.kind = kind;
    value.node = std::make_shared<Node>();
    return value;
  }
  // Records that `item` now lives inside `owner` (a container being built or changed).
  void place(std::size_t at, Node& owner, const Value& item) {
    if (item.kind == Value::Kind::kMark) fail_at(at, "a MARK cannot be a value");
    if (item.node) item.node->contained = true;
    owner.depth = std::max(owner.depth, depth_of(item) + 1);
    if (owner.depth + marks_.size() > kMaxArchiveNesting) {
      fail_at(at, "values nest more than ", kMaxArchiveNesting,
              " deep; LibTorch's reader would recurse that deep");
    }
  }
  // APPEND(S), SETITEM(S), BUILD: places `items` into the container on top of the stack, which
  // must be of `kind` and not inside another yet.
  void add_to_top(std::size_t at, unsigned char op, Value::Kind kind,
                  const std::vector<Value>& items) {
    Value& target = top(at, op);
    if (target.kind != kind) {
      fail_at(at, describe_pickle_opcode(op), " applies to ", kind_name(target.kind),
              ", which it cannot change");
    }
    if (target.node->contained) {
      fail_at(at, describe_pickle_opcode(op), " changes ", kind_name(target.kind),
              " that is already inside another value; LibTorch's pickler never does that");
    }
    for (const Value& item : items) place(at, *target.node, item);
  }
  Value tuple_of(std::size_t at, std::vector<Value> items) {
    Value tuple = container(Value::Kind::kTuple);
    for (const Value& item : items) place(at, *tuple.node, item);
    tuple.node->size = items.size();
    if (items.size() <= kMaxKeptItems) tuple.node->items = std::move(items);
    return tuple;
  }

  void memo_put(std::size_t at, unsigned char op, std::uint64_t index) {
    // Picklers number memo entries 0, 1, 2, ...; LibTorch's reader sizes its memo by the index.
    if (index > memo_.size()) {
      fail_at(at, describe_pickle_opcode(op), " stores memo index ", index, " but only ",
              memo_.size(), " entries exist; indices are assigned in order");
    }
    const Value& value = top(at, op);
    if (index == memo_.size()) {
      memo_.push_back(value);
    } else {
      memo_[index] = value;
    }
  }
  void memo_get(std::size_t at, unsigned char op, std::uint64_t index) {
    if (index >= memo_.size()) {
      fail_at(at, describe_pickle_opcode(op), " fetches memo index ", index,
              ", which nothing was stored at");
    }
    push(at, memo_[index]);
  }

  void global(std::size_t at, std::string_view module, std::string_view name) {
    Value value;
    value.kind = Value::Kind::kGlobal;
    if ((module == "__torch__" || starts_with(module, "__torch__.")) && is_dotted_name(module) &&
        is_identifier(name)) {
      value.callable = Callable::kClass;
    } else if (module == "torch") {
      for (const StorageType& type : kStorageTypes) {
        if (name == type.name) {
          value.callable = Callable::kStorage;
          value.element_size = type.element_size;
        }
      }
      for (const StorageType& type : kSavedDtypes) {
        if (name == type.name) {
          value.callable = Callable::kDtype;
          value.element_size = type.element_size;
        }
      }
    } else if (module == "torch.storage" && name == "UntypedStorage") {
      value.callable = Callable::kStorage;  // its element count is in bytes
      value.element_size = 1;
      value.untyped = true;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      value.callable = Callable::kRebuildTensor;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v3") {
      value.callable = Callable::kRebuildTensorV3;
    } else if (module == "torch._utils" &&
               (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state")) {
      value.callable = Callable::kRebuildParameter;
    } else if (module == "collections" && name == "OrderedDict") {
      value.callable = Callable::kOrderedDict;
    } else if (module == "torch.jit._pickle") {
      if (name == "build_intlist" || name == "build_doublelist" || name == "build_boollist" ||
          name == "build_tensorlist") {
        value.callable = Callable::kBuildList;
      } else if (name == "restore_type_tag") {
        value.callable = Callable::kRestoreTypeTag;
      }
    }
    if (value.callable == Callable::kNone) {
      fail_at(at, "GLOBAL imports ", quoted(module), ".", quoted(name),
              ", which amp does not read (only __torch__ classes, tensor storages and dtypes, "
              "_rebuild_tensor_v2/v3, _rebuild_parameter, OrderedDict and torch.jit._pickle's "
              "builders)");
    }
    push(at, std::move(value));
  }

  // BINPERSID: ('storage', torch.<X>Storage, key, location, numel) -> a storage.
  void persistent_id(std::size_t at) {
    const Value record = pop(at, kBinPersId);
    const auto refuse = [&](const auto&... why) {
      fail_at(at, "a tensor record (BINPERSID) ", why...,
              "; LibTorch writes ('storage', torch.<dtype>Storage, '<n>', '<device>', numel)");
    };
    if (record.kind != Value::Kind::kTuple || record.node->size != 5 ||
        record.node->items.size() != 5) {
      refuse("is ", kind_name(record.kind), " rather than a tuple of 5");
    }
    const std::vector<Value>& items = record.node->items;
    if (items[0].kind != Value::Kind::kString || items[0].text != "storage") {
      refuse("does not start with 'storage'");
    }
    if (items[1].kind != Value::Kind::kGlobal || items[1].callable != Callable::kStorage) {
      refuse("has ", kind_name(items[1].kind), " where a known storage type should be");
    }
    if (items[2].kind != Value::Kind::kString || items[2].text.empty() ||
        items[2].text.size() > 20 ||
        !std::all_of(items[2].text.begin(), items[2].text.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      refuse("has a key that is not a decimal number");
    }
    const std::string_view location = items[3].kind == Value::Kind::kString ? items[3].text : "";
    const std::size_t colon = location.find(':');
    const std::string_view device_type = location.substr(0, colon);
    const std::string_view device_index =
        colon == std::string_view::npos ? std::string_view("0") : location.substr(colon + 1);
    if (location.size() > 32 || !is_identifier(device_type) || device_index.empty() ||
        device_index.size() > 4 ||
        !std::all_of(device_index.begin(), device_index.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      refuse("has the device ", quoted(location), " (expected like 'cpu' or 'cuda:1')");
    }
    if (items[4].kind != Value::Kind::kInt || items[4].integer < 0) {
      refuse("has ", kind_name(items[4].kind), " ", items[4].integer,
             " where the element count should be");
    }
    const std::string name = std::string(tensor_dir()) + std::string(items[2].text);
    const std::optional<std::uint64_t> size = record_size_ ? record_size_(name) : std::nullopt;
    if (!size) refuse("names the entry ", quoted(name), ", which the archive does not have");
    const auto numel = static_cast<std::uint64_t>(items[4].integer);
    if (numel > *size / items[1].element_size) {
      refuse("says ", numel, " elements of ", items[1].element_size, " bytes but ", quoted(name),
             " has ", *size, " bytes");
    }
    Value storage;
    storage.kind = Value::Kind::kStorage;
    storage.numel = numel;
    storage.element_size = items[1].element_size;
    storage.untyped = items[1].untyped;
    push(at, std::move(storage));
  }
  std::string_view tensor_dir() const {
    return ends_with(entry_name_, "constants.pkl") ? "constants/" : "data/";
  }

  // The ints of a sizes or strides tuple, each in [0, 2^62].
  std::vector<std::uint64_t> int_tuple(std::size_t at, const Value& value, const char* what) {
    if (value.kind != Value::Kind::kTuple || value.node->items.size() != value.node->size ||
        value.node->size > kMaxArchiveTensorDims) {
      fail_at(at, "_rebuild_tensor_v2's ", what, " is ", kind_name(value.kind),
              " rather than a tuple of at most ", kMaxArchiveTensorDims, " ints");
    }
    std::vector<std::uint64_t> result;
    for (const Value& item : value.node->items) {
      if (item.kind != Value::Kind::kInt || item.integer < 0 ||
          item.integer > (std::int64_t{1} << 62)) {
        fail_at(at, "_rebuild_tensor_v2's ", what, " hold ", kind_name(item.kind), " ",
                item.integer, " where a non-negative int should be");
      }
      result.push_back(static_cast<std::uint64_t>(item.integer));
    }
    return result;
  }

  // REDUCE of _rebuild_tensor_v2(storage, offset, sizes, strides, requires_grad, hooks[, meta])
  // or _rebuild_tensor_v3(..., hooks, dtype[, meta]), whose storage counts bytes.
  Value rebuild_tensor(std::size_t at, const Value& args, bool v3) {
    const std::size_t least = v3 ? 7 : 6;
    if (args.kind != Value::Kind::kTuple || args.node->size < least ||
        args.node->size > least + 1) {
      fail_at(at, v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2", " is called with ",
              kind_name(args.kind), " rather than a tuple of ", least, " or ", least + 1,
              " arguments");
    }
    const std::vector<Value>& items = args.node->items;
    // The storage's element count, in elements of the tensor's dtype.
    std::uint64_t storage_numel = items[0].numel;
    if (v3) {
      if (items[6].kind != Value::Kind::kGlobal || items[6].callable != Callable::kDtype) {
        fail_at(at, "_rebuild_tensor_v3's dtype is ", kind_name(items[6].kind),
                " rather than a dtype torch.save names (torch.float8_e4m3fn, ...)");
      }
    }
    if (items[0].kind == Value::Kind::kStorage && items[0].untyped != v3) {
      fail_at(at, v3 ? "_rebuild_tensor_v3's storage is typed; torch.save gives it an "
                       "UntypedStorage"
                     : "_rebuild_tensor_v2's storage is untyped; torch.save gives it a typed one");
    }
    if (v3) storage_numel = items[0].numel / items[6].element_size;
    if (items[0].kind != Value::Kind::kStorage) {
      fail_at(at, "_rebuild_tensor_v2's first argument is ", kind_name(items[0].kind),
              " rather than a tensor record");
    }
    if (items[1].kind != Value::Kind::kInt || items[1].integer < 0) {
      fail_at(at, "_rebuild_tensor_v2's storage offset is not a non-negative int");
    }
    const std::vector<std::uint64_t> sizes = int_tuple(at, items[2], "sizes");
    const std::vector<std::uint64_t> strides = int_tuple(at, items[3], "strides");
    if (sizes.size() != strides.size()) {
      fail_at(at, "_rebuild_tensor_v2 has ", sizes.size(), " sizes but ", strides.size(),
              " strides");
    }
    if (items[4].kind != Value::Kind::kBool) {
      fail_at(at, "_rebuild_tensor_v2's requires_grad is ", kind_name(items[4].kind));
    }
    // The last element read is offset + sum((size - 1) * stride); it must be inside the storage.
    const auto offset = static_cast<unsigned __int128>(items[1].integer);
    unsigned __int128 last = offset;
    bool empty = false;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] == 0) empty = true;
      if (sizes[d] > 0) last += static_cast<unsigned __int128>(sizes[d] - 1) * strides[d];
    }
    if (!empty && last >= storage_numel) {
      fail_at(at, "_rebuild_tensor_v2 reads past its storage of ", storage_numel,
              " elements (storage offset ", items[1].integer, ", ", sizes.size(), " dimensions)");
    }
    if (empty && offset > storage_numel) {
      fail_at(at, "_rebuild_tensor_v2's storage offset ", items[1].integer,
              " is past its storage of ", storage_numel, " elements");
    }
    Value tensor;
    tensor.kind = Value::Kind::kTensor;
    return tensor;
  }

  void reduce(std::size_t at) {
    const Value args = pop(at, kReduce);
    const Value callable = pop(at, kReduce);
    if (callable.kind != Value::Kind::kGlobal) {
      fail_at(at, "REDUCE calls ", kind_name(callable.kind), " rather than an imported function");
    }
    if (args.kind != Value::Kind::kTuple) {
      fail_at(at, "REDUCE's arguments are ", kind_name(args.kind), " rather than a tuple");
    }
    const std::vector<Value>& items = args.node->items;
    switch (callable.callable) {
      case Callable::kRebuildTensor:
      case Callable::kRebuildTensorV3:
        push(at, rebuild_tensor(at, args, callable.callable == Callable::kRebuildTensorV3));
        return;
      case Callable::kRebuildParameter: {
        // (tensor, requires_grad, backward_hooks[, state]): the parameter is its tensor.
        if ((args.node->size != 3 && args.node->size != 4) || items.size() != args.node->size ||
            items[0].kind != Value::Kind::kTensor || items[1].kind != Value::Kind::kBool ||
            items[2].kind != Value::Kind::kDict) {
          fail_at(at,
                  "_rebuild_parameter is called with something other than a tensor, "
                  "requires_grad and its hooks");
        }
        push(at, items[0]);
        return;
      }
      case Callable::kOrderedDict: {
        if (args.node->size != 0) fail_at(at, "OrderedDict is called with arguments");
        Value dict = container(Value::Kind::kDict);
        dict.node->ordered_dict = true;
        push(at, std::move(dict));
        return;
      }
      case Callable::kBuildList: {
        if (args.node->size != 1 || items.size() != 1 || items[0].kind != Value::Kind::kList) {
          fail_at(at,
                  "a torch.jit._pickle list builder is called with something other than "
                  "one list");
        }
        Value list = container(Value::Kind::kList);
        place(at, *list.node, items[0]);
        push(at, std::move(list));
        return;
      }
      case Callable::kRestoreTypeTag: {
        if (args.node->size != 2 || items.size() != 2 || items[1].kind != Value::Kind::kString) {
          fail_at(at, "restore_type_tag is called with something other than a value and a type");
        }
        check_archive_type(items[1].text, entry_name_, at);
        push(at, items[0]);
        return;
      }
      default:
        fail_at(at, "REDUCE calls ",
                callable.callable == Callable::kClass ? "a class" : "a storage or dtype",
                "; archives only call tensor and list builders and OrderedDict");
    }
  }

  // Executes `decoded`, an opcode other than STOP.
  void step(const PickleOp& decoded) {
    const std::size_t at = decoded.at;
    const unsigned char op = decoded.code;
    switch (op) {
      case kFrame:  // a length hint; the opcodes that follow are checked one by one
        return;
      case kMark:
        if (marks_.size() + 1 > kMaxArchiveNesting) {
          fail_at(at, "MARKs nest more than ", kMaxArchiveNesting, " deep");
        }
        marks_.push_back(stack_.size());
        return;
      case kNone:
        push(at, Value{});
        return;
      case kNewTrue:
      case kNewFalse:
        push(at, scalar(Value::Kind::kBool, op == kNewTrue));
        return;
      case kBinInt:
      case kBinInt1:
      case kBinInt2:
      case kLong1:
        push(at, scalar(Value::Kind::kInt, decoded.integer));
        return;
      case kBinFloat:  // its value matters to nothing the scanner checks
        push(at, scalar(Value::Kind::kFloat));
        return;
      case kBinUnicode:
      case kShortBinUnicode:
        push(at, scalar(Value::Kind::kString, 0, decoded.text));
        return;
      case kGlobal:
        global(at, decoded.text, decoded.text2);
        return;
      case kBinPersId:
        persistent_id(at);
        return;
      case kReduce:
        reduce(at);
        return;
      case kEmptyTuple:
        push(at, tuple_of(at, {}));
        return;
      case kTuple:
        push(at, tuple_of(at, pop_mark(at, op)));
        return;
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const std::size_t n = op - kTuple1 + 1u;
        std::vector<Value> items(n);
        for (std::size_t k = n; k-- > 0;) items[k] = pop(at, op);
        push(at, tuple_of(at, std::move(items)));
        return;
      }
      case kEmptyList:
        push(at, container(Value::Kind::kList));
        return;
      case kEmptyDict:
        push(at, container(Value::Kind::kDict));
        return;
      case kAppend:
        add_to_top(at, op, Value::Kind::kList, {pop(at, op)});
        return;
      case kAppends:
        add_to_top(at, op, Value::Kind::kList, pop_mark(at, op));
        return;
      case kSetItem: {
        const Value value = pop(at, op);
        const Value key = pop(at, op);
        add_to_top(at, op, Value::Kind::kDict, {key, value});
        return;
      }
      case kSetItems: {
        const std::vector<Value> items = pop_mark(at, op);
        if (items.size() % 2 != 0) {
          fail_at(at, "SETITEMS has ", items.size(), " values; keys and values come in pairs");
        }
        add_to_top(at, op, Value::Kind::kDict, items);
        return;
      }
      case kNewObj: {
        const Value args = pop(at, op);
        const Value cls = pop(at, op);
        if (cls.kind != Value::Kind::kGlobal || cls.callable != Callable::kClass) {
          fail_at(at, "NEWOBJ creates ", kind_name(cls.kind),
                  " rather than an instance of a __torch__ class");
        }
        if (args.kind != Value::Kind::kTuple || args.node->size != 0) {
          fail_at(at, "NEWOBJ passes arguments; LibTorch's archives create objects without any");
        }
        push(at, container(Value::Kind::kObject));
        return;
      }
      case kBuild: {  // an object's state, or the attributes of Python's OrderedDict
        Value state = pop(at, op);
        const Value& target = top(at, op);
        if (target.kind == Value::Kind::kDict && target.node->ordered_dict) {
          // A module's state_dict() carries `_metadata` (module versions) this way.
          if (state.kind != Value::Kind::kDict) {
            fail_at(at, "BUILD gives an OrderedDict ", kind_name(state.kind),
                    " rather than a dict of attributes");
          }
          add_to_top(at, op, Value::Kind::kDict, {state});
          return;
        }
        add_to_top(at, op, Value::Kind::kObject, {state});
        return;
      }
      case kBinPut:
      case kLongBinPut:
        memo_put(at, op, decoded.number);
        return;
      case kMemoize:
        memo_put(at, op, memo_.size());
        return;
      case kBinGet:
      case kLongBinGet:
        memo_get(at, op, decoded.number);
        return;
      default:  // not in kArchiveOpcodes: next() has refused it
        return;
    }
  }

  const ArchiveRecordSize& record_size_;
  std::vector<Value> stack_;
  std::vector<std::size_t> marks_;  // stack sizes at each open MARK
  std::vector<Value> memo_;
};

}  // namespace

void check_archive_pickle(std::string_view pickle, std::string_view entry_name,
                          const ArchiveRecordSize& record_size) {
  ArchivePickleScanner(pickle, entry_name, record_size).run();
}

}  // namespace amp::detail
