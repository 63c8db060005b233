// The torch.save pickle evaluator (pickle_values.h): a stack machine over PickleCursor that
// builds PickledValues, with the tensor records' storages and dtypes resolved.
#include "serialize/pickle_values.h"

#include <iterator>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "serialize/pickle_cursor.h"

namespace amp::detail {

namespace {

using namespace opcode;

constexpr PickleOpcodeSet kTorchSaveOpcodes = pickle_opcodes({kMark,
                                                              kEmptyTuple,
                                                              kStop,
                                                              kBinFloat,
                                                              kBinInt,
                                                              kBinInt1,
                                                              kBinInt2,
                                                              kNone,
                                                              kBinPersId,
                                                              kReduce,
                                                              kBinUnicode,
                                                              kEmptyList,
                                                              kAppend,
                                                              kBuild,
                                                              kGlobal,
                                                              kAppends,
                                                              kBinGet,
                                                              kLongBinGet,
                                                              kBinPut,
                                                              kLongBinPut,
                                                              kSetItem,
                                                              kTuple,
                                                              kSetItems,
                                                              kEmptyDict,
                                                              kTuple1,
                                                              kTuple2,
                                                              kTuple3,
                                                              kNewTrue,
                                                              kNewFalse,
                                                              kLong1,
                                                              kShortBinUnicode,
                                                              kMemoize,
                                                              kFrame});

using Dtype = SavedDtype;
constexpr SavedDtype kDtypes[] = {
    {"float32", "FloatStorage", true, 4},
    {"float64", "DoubleStorage", true, 8},
    {"float16", "HalfStorage", true, 2},
    {"bfloat16", "BFloat16Storage", true, 2},
    {"int64", "LongStorage", true, 8},
    {"int32", "IntStorage", true, 4},
    {"int16", "ShortStorage", true, 2},
    {"int8", "CharStorage", true, 1},
    {"uint8", "ByteStorage", true, 1},
    {"bool", "BoolStorage", true, 1},
    {"complex64", "ComplexFloatStorage", true, 8},
    {"complex128", "ComplexDoubleStorage", true, 16},
    {"float8_e4m3fn", "float8_e4m3fn", false, 1},
    {"float8_e5m2", "float8_e5m2", false, 1},
    {"float8_e4m3fnuz", "float8_e4m3fnuz", false, 1},
    {"float8_e5m2fnuz", "float8_e5m2fnuz", false, 1},
    {"float8_e8m0fnu", "float8_e8m0fnu", false, 1},
    {"uint16", "uint16", false, 2},
    {"uint32", "uint32", false, 4},
    {"uint64", "uint64", false, 8},
};

// What the machine's stack holds besides PickledValues: MARKs, imported names, storages, and a
// tensor rebuild's arguments (a tuple holding a storage and maybe a dtype, which no value holds).
struct Item {
  enum class Kind { kValue, kMark, kGlobal, kStorage, kRebuildArgs };
  Kind kind = Kind::kValue;
  PickledValue value;
  // kGlobal: what it names; kStorage: the record.
  enum class Global {
    kNone,
    kOrderedDict,
    kRebuildV2,
    kRebuildV3,
    kRebuildParameter,
    kRebuildParameterWithState,
    kStorageType,
    kUntyped,
    kDtype
  };
  Global global = Global::kNone;
  const Dtype* dtype = nullptr;  // kStorageType, kDtype; kStorage (null: untyped)
  std::string key, location;     // kStorage
  std::uint64_t numel = 0;       // kStorage: in its dtype's elements, or bytes when untyped
  std::shared_ptr<const std::vector<Item>> args;  // kRebuildArgs
};

const char* item_name(const Item& item) {
  switch (item.kind) {
    case Item::Kind::kMark:
      return "a MARK";
    case Item::Kind::kGlobal:
      return "an imported name";
    case Item::Kind::kStorage:
      return "a tensor storage";
    case Item::Kind::kRebuildArgs:
      return "a tensor rebuild's arguments";
    default:
      return describe_kind(item.value.kind);
  }
}

Item value_item(PickledValue value) {
  Item item;
  item.value = std::move(value);
  return item;
}

class TorchPickleEvaluator : PickleCursor {
 public:
  TorchPickleEvaluator(std::string_view pickle, std::string_view entry_name)
      : PickleCursor(pickle, entry_name, kTorchSaveOpcodes,
                     "is not used by torch.save; the file is damaged or holds other objects") {}
  TorchPickleEvaluator(const TorchPickleEvaluator&) = delete;
  TorchPickleEvaluator& operator=(const TorchPickleEvaluator&) = delete;
  // A refused pickle may have built containers that hold each other: they are emptied, so that
  // none outlives the evaluator.
  ~TorchPickleEvaluator() {
    if (accepted_) return;
    for (PickledValue& made : containers_) {
      made.items->clear();
      if (made.attributes) *made.attributes = PickledValue{};
    }
  }

  PickledValue run() {
    while (true) {
      const PickleOp op = next();
      if (op.code == kStop) {
        if (stack_.size() != 1 || !marks_.empty()) {
          fail_at(op.at, "STOP with ", stack_.size(), " values on the stack");
        }
        PickledValue result = value_of(op.at, stack_.back(), "the pickle's result");
        refuse_cycles(op.at);
        accepted_ = true;
        return result;
      }
      step(op);
    }
  }

 private:
  PickledValue container(PickledValue::Kind kind, std::vector<PickledValue> items = {}) {
    PickledValue value;
    value.kind = kind;
    value.items = std::make_shared<std::vector<PickledValue>>(std::move(items));
    containers_.push_back(value);
    return value;
  }

  // Python builds a list that holds itself (`l.append(l)`), or a dict that does through its
  // values; a C++ value (an IValue) that did would never be freed and would send every walk over
  // it (converting, printing, saving) round for ever. Every container the pickle made is walked
  // once, without recursion, and the first one found inside itself is refused.
  void refuse_cycles(std::size_t at) const {
    enum class State : char { kOpen, kDone };
    std::unordered_map<const void*, State> seen;
    // A container being walked: its items, then its attributes (an OrderedDict's).
    struct Frame {
      const PickledValue* value;
      std::size_t next;
    };
    std::vector<Frame> path;
    const auto enter = [&](const PickledValue& value) {
      if (!value.items) return;
      const auto [found, fresh] = seen.try_emplace(value.items.get(), State::kOpen);
      if (fresh) {
        path.push_back({&value, 0});
      } else if (found->second == State::kOpen) {
        fail_at(at, describe_kind(value.kind),
                " holds itself (directly or through the values inside it); Python can build "
                "such a value, but amp reads only values that do not refer to themselves: save "
                "the object without the self-reference");
      }
    };
    for (const PickledValue& root : containers_) {
      enter(root);
      while (!path.empty()) {
        Frame& frame = path.back();
        const std::vector<PickledValue>& items = *frame.value->items;
        if (frame.next < items.size()) {
          enter(items[frame.next++]);
        } else if (frame.next == items.size() && frame.value->attributes) {
          ++frame.next;
          enter(*frame.value->attributes);
        } else {
          seen[frame.value->items.get()] = State::kDone;
          path.pop_back();
        }
      }
    }
  }

  Item pop(std::size_t at) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) fail_at(at, "an opcode needs a value but the stack is empty");
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  std::vector<Item> pop_mark(std::size_t at, unsigned char op) {
    return PickleCursor::pop_mark(stack_, marks_, at, op);
  }
  PickledValue value_of(std::size_t at, const Item& item, const char* role) {
    if (item.kind != Item::Kind::kValue) fail_at(at, role, " is ", item_name(item));
    return item.value;
  }
  std::vector<PickledValue> values_of(std::size_t at, const std::vector<Item>& items) {
    std::vector<PickledValue> values;
    values.reserve(items.size());
    for (const Item& item : items) values.push_back(value_of(at, item, "an item"));
    return values;
  }
  // The container on top of the stack, which must be of `kind`.
  std::vector<PickledValue>& top_items(std::size_t at, PickledValue::Kind kind) {
    if (stack_.empty() || stack_.back().kind != Item::Kind::kValue ||
        stack_.back().value.kind != kind) {
      fail_at(at, "an opcode adds to ", stack_.empty() ? "nothing" : item_name(stack_.back()),
              " rather than ", describe_kind(kind));
    }
    return *stack_.back().value.items;
  }

  void global(std::size_t at, std::string_view module, std::string_view name) {
    Item item;
    item.kind = Item::Kind::kGlobal;
    if (module == "collections" && name == "OrderedDict") {
      item.global = Item::Global::kOrderedDict;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      item.global = Item::Global::kRebuildV2;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v3") {
      item.global = Item::Global::kRebuildV3;
    } else if (module == "torch._utils" && name == "_rebuild_parameter") {
      item.global = Item::Global::kRebuildParameter;
    } else if (module == "torch._utils" && name == "_rebuild_parameter_with_state") {
      item.global = Item::Global::kRebuildParameterWithState;
    } else if (module == "torch.storage" && name == "UntypedStorage") {
      item.global = Item::Global::kUntyped;
    } else if (module == "torch") {
      for (const Dtype& d : kDtypes) {
        if (name == d.global) {
          item.global = d.typed_storage ? Item::Global::kStorageType : Item::Global::kDtype;
          item.dtype = &d;
        }
      }
    }
    if (item.global == Item::Global::kNone) {
      fail_at(at, "GLOBAL imports ", quoted(module), ".", quoted(name),
              ", which torch.save does not write for tensors, numbers and containers");
    }
    stack_.push_back(std::move(item));
  }

  // ('storage', type, key, location, numel) kept as a pending record until BINPERSID.
  Item storage_record(std::size_t at, const std::vector<Item>& items) {
    const auto text = [&](const Item& item) {
      if (item.kind != Item::Kind::kValue || item.value.kind != PickledValue::Kind::kString) {
        fail_at(at, "a tensor record holds ", item_name(item), " where a string should be");
      }
      return item.value.text;
    };
    if (text(items[0]) != "storage") fail_at(at, "a tensor record does not start with 'storage'");
    const Item& type = items[1];
    if (type.global != Item::Global::kStorageType && type.global != Item::Global::kUntyped) {
      fail_at(at, "a tensor record names no storage type");
    }
    if (items[4].kind != Item::Kind::kValue || items[4].value.kind != PickledValue::Kind::kInt ||
        items[4].value.integer < 0) {
      fail_at(at, "a tensor record's element count is not a non-negative int");
    }
    Item record;
    record.kind = Item::Kind::kStorage;
    record.global = Item::Global::kNone;  // a record, not yet a storage
    record.dtype = type.global == Item::Global::kUntyped ? nullptr : type.dtype;
    record.key = text(items[2]);
    record.location = text(items[3]);
    record.numel = static_cast<std::uint64_t>(items[4].value.integer);
    return record;
  }

  std::vector<std::int64_t> ints(std::size_t at, const PickledValue& tuple, const char* what) {
    if (tuple.kind != PickledValue::Kind::kTuple)
      fail_at(at, "a tensor's ", what, " is not a tuple");
    std::vector<std::int64_t> result;
    for (const PickledValue& item : *tuple.items) {
      if (item.kind != PickledValue::Kind::kInt || item.integer < 0) {
        fail_at(at, "a tensor's ", what, " hold something other than a non-negative int");
      }
      result.push_back(item.integer);
    }
    return result;
  }

  // _rebuild_tensor_v2(storage, offset, sizes, strides, requires_grad, hooks[, metadata]) or
  // _v3(..., hooks, dtype[, metadata]).
  PickledValue rebuild_tensor(std::size_t at, const std::vector<Item>& args, bool v3) {
    const std::size_t least = v3 ? 7 : 6;
    if (args.size() < least || args.size() > least + 1 || args[0].kind != Item::Kind::kStorage) {
      fail_at(at, "a tensor is rebuilt from other arguments than torch.save writes");
    }
    const Item& storage = args[0];
    const Dtype* dtype = storage.dtype;
    std::uint64_t numel = storage.numel;
    if (v3) {
      if (args[6].kind != Item::Kind::kGlobal || args[6].global != Item::Global::kDtype ||
          dtype != nullptr) {
        fail_at(at, "_rebuild_tensor_v3 is called without an untyped storage and a dtype");
      }
      dtype = args[6].dtype;
      numel /= dtype->element_size;
    } else if (dtype == nullptr) {
      fail_at(at, "_rebuild_tensor_v2 is called with an untyped storage");
    }
    auto tensor = std::make_shared<PickledTensor>();
    tensor->key = storage.key;
    tensor->dtype = dtype->name;
    tensor->element_size = dtype->element_size;
    tensor->location = storage.location;
    tensor->storage_numel = numel;
    const PickledValue offset = value_of(at, args[1], "a tensor's storage offset");
    if (offset.kind != PickledValue::Kind::kInt || offset.integer < 0) {
      fail_at(at, "a tensor's storage offset is not a non-negative int");
    }
    tensor->offset = offset.integer;
    tensor->sizes = ints(at, value_of(at, args[2], "a tensor's sizes"), "sizes");
    tensor->strides = ints(at, value_of(at, args[3], "a tensor's strides"), "strides");
    const PickledValue requires_grad = value_of(at, args[4], "requires_grad");
    tensor->requires_grad =
        requires_grad.kind == PickledValue::Kind::kBool && requires_grad.integer;
    PickledValue value;
    value.kind = PickledValue::Kind::kTensor;
    value.tensor = std::move(tensor);
    return value;
  }

  // _rebuild_parameter(tensor, requires_grad, backward_hooks) or _rebuild_parameter_with_state(
  // ..., state): an nn.Parameter, which is its tensor with requires_grad. Its hooks (an empty
  // OrderedDict when torch.save wrote it) and the Python attributes in `state` have no C++ form.
  PickledValue parameter(std::size_t at, const Item& args, bool with_state) {
    const std::size_t count = with_state ? 4 : 3;
    if (args.kind != Item::Kind::kValue || args.value.kind != PickledValue::Kind::kTuple ||
        args.value.items->size() != count ||
        (*args.value.items)[0].kind != PickledValue::Kind::kTensor ||
        (*args.value.items)[1].kind != PickledValue::Kind::kBool ||
        (*args.value.items)[2].kind != PickledValue::Kind::kDict) {
      fail_at(at, with_state ? "_rebuild_parameter_with_state" : "_rebuild_parameter",
              " is called with other arguments than torch.save writes (a tensor, requires_grad "
              "and its hooks",
              with_state ? ", and its attributes)" : ")");
    }
    const std::vector<PickledValue>& items = *args.value.items;
    auto tensor = std::make_shared<PickledTensor>(*items[0].tensor);
    tensor->requires_grad = items[1].integer != 0;
    PickledValue value;
    value.kind = PickledValue::Kind::kTensor;
    value.tensor = std::move(tensor);
    return value;
  }

  void reduce(std::size_t at) {
    Item args = pop(at);
    const Item callable = pop(at);
    if (callable.kind != Item::Kind::kGlobal) fail_at(at, "REDUCE calls ", item_name(callable));
    if (callable.global == Item::Global::kOrderedDict) {
      if (args.kind != Item::Kind::kValue || args.value.kind != PickledValue::Kind::kTuple ||
          !args.value.items->empty()) {
        fail_at(at, "OrderedDict is called with arguments");
      }
      PickledValue dict = container(PickledValue::Kind::kDict);
      dict.ordered_dict = true;
      dict.attributes = std::make_shared<PickledValue>();
      containers_.back() = dict;
      stack_.push_back(value_item(std::move(dict)));
      return;
    }
    if (callable.global == Item::Global::kRebuildParameter ||
        callable.global == Item::Global::kRebuildParameterWithState) {
      stack_.push_back(value_item(
          parameter(at, args, callable.global == Item::Global::kRebuildParameterWithState)));
      return;
    }
    if (callable.global != Item::Global::kRebuildV2 &&
        callable.global != Item::Global::kRebuildV3) {
      fail_at(at, "REDUCE calls a storage or dtype");
    }
    if (args.kind != Item::Kind::kRebuildArgs) {
      fail_at(at, "a tensor is rebuilt from ", item_name(args), " rather than its storage's tuple");
    }
    stack_.push_back(
        value_item(rebuild_tensor(at, *args.args, callable.global == Item::Global::kRebuildV3)));
  }

  void step(const PickleOp& op) {
    const std::size_t at = op.at;
    switch (op.code) {
      case kFrame:
        return;
      case kMark:
        marks_.push_back(stack_.size());
        return;
      case kNone:
        stack_.push_back(value_item(PickledValue{}));
        return;
      case kNewTrue:
      case kNewFalse:
        stack_.push_back(
            value_item(pickled_scalar(PickledValue::Kind::kBool, op.code == kNewTrue)));
        return;
      case kBinInt:
      case kBinInt1:
      case kBinInt2:
      case kLong1:
        stack_.push_back(value_item(pickled_scalar(PickledValue::Kind::kInt, op.integer)));
        return;
      case kBinFloat:
        stack_.push_back(value_item(pickled_scalar(PickledValue::Kind::kFloat, 0, op.real)));
        return;
      case kBinUnicode:
      case kShortBinUnicode:
        stack_.push_back(
            value_item(pickled_scalar(PickledValue::Kind::kString, 0, 0.0, std::string(op.text))));
        return;
      case kGlobal:
        global(at, op.text, op.text2);
        return;
      case kBinPersId: {
        Item record = pop(at);
        if (record.kind != Item::Kind::kStorage) persistent_id_refused(at, record);
        stack_.push_back(std::move(record));  // now the storage itself
        return;
      }
      case kReduce:
        reduce(at);
        return;
      case kEmptyTuple:
        stack_.push_back(value_item(container(PickledValue::Kind::kTuple)));
        return;
      case kTuple:
        tuple_or_args(at, pop_mark(at, op.code));
        return;
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        std::vector<Item> items(op.code - kTuple1 + 1u);
        for (std::size_t k = items.size(); k-- > 0;) items[k] = pop(at);
        tuple_or_args(at, std::move(items));
        return;
      }
      case kEmptyList:
        stack_.push_back(value_item(container(PickledValue::Kind::kList)));
        return;
      case kEmptyDict:
        stack_.push_back(value_item(container(PickledValue::Kind::kDict)));
        return;
      case kAppend: {
        const PickledValue item = value_of(at, pop(at), "an appended item");
        top_items(at, PickledValue::Kind::kList).push_back(item);
        return;
      }
      case kAppends: {
        std::vector<PickledValue> items = values_of(at, pop_mark(at, op.code));
        auto& list = top_items(at, PickledValue::Kind::kList);
        list.insert(list.end(), items.begin(), items.end());
        return;
      }
      case kSetItem: {
        const PickledValue value = value_of(at, pop(at), "a dict's value");
        const PickledValue key = value_of(at, pop(at), "a dict's key");
        set_items(at, {key, value});
        return;
      }
      case kSetItems: {
        std::vector<PickledValue> items = values_of(at, pop_mark(at, op.code));
        if (items.size() % 2 != 0) fail_at(at, "SETITEMS has an odd number of values");
        set_items(at, items);
        return;
      }
      case kBuild: {
        // Only an OrderedDict's attributes (a module state_dict's `_metadata`: the versions
        // Python's modules read when they load).
        const PickledValue state = value_of(at, pop(at), "BUILD's state");
        (void)top_items(at, PickledValue::Kind::kDict);
        const PickledValue& target = stack_.back().value;
        if (!target.ordered_dict || state.kind != PickledValue::Kind::kDict) {
          fail_at(at, "BUILD gives state to something other than an OrderedDict");
        }
        if (target.attributes->kind != PickledValue::Kind::kNone) {
          fail_at(at, "BUILD gives an OrderedDict attributes twice");
        }
        *target.attributes = state;
        return;
      }
      case kBinPut:
      case kLongBinPut:
        memo_put(at, op.number);
        return;
      case kMemoize:
        memo_put(at, memo_.size());
        return;
      case kBinGet:
      case kLongBinGet:
        if (op.number >= memo_.size()) fail_at(at, "a memo index was never stored");
        stack_.push_back(memo_[op.number]);
        return;
      default:
        return;
    }
  }

  [[noreturn]] void persistent_id_refused(std::size_t at, const Item& record) {
    fail_at(at, "BINPERSID applies to ", item_name(record),
            " rather than ('storage', <type>, <key>, <device>, <count>)");
  }

  // A tuple of values, a tensor record (kept as an Item), or the arguments of a tensor rebuild
  // (which hold a storage and maybe a dtype: an Item for the REDUCE that follows).
  void tuple_or_args(std::size_t at, std::vector<Item> items) {
    bool all_values = true;
    for (const Item& item : items) all_values = all_values && item.kind == Item::Kind::kValue;
    if (all_values) {
      stack_.push_back(value_item(container(PickledValue::Kind::kTuple, values_of(at, items))));
    } else if (items.size() == 5 && items[1].kind == Item::Kind::kGlobal &&
               items[0].kind == Item::Kind::kValue) {
      stack_.push_back(storage_record(at, items));
    } else if (!items.empty() && items[0].kind == Item::Kind::kStorage) {
      Item args;
      args.kind = Item::Kind::kRebuildArgs;
      args.args = std::make_shared<const std::vector<Item>>(std::move(items));
      stack_.push_back(std::move(args));
    } else {
      fail_at(at, "a tuple holds a MARK, an imported name or a storage");
    }
  }

  void set_items(std::size_t at, const std::vector<PickledValue>& items) {
    auto& dict = top_items(at, PickledValue::Kind::kDict);
    auto& keys = dict_keys_[&dict];
    for (std::size_t k = 0; k < items.size(); k += 2) {
      const PickledValue& key = items[k];
      if (key.kind != PickledValue::Kind::kString && key.kind != PickledValue::Kind::kInt) {
        fail_at(at, "a dict key is ", describe_kind(key.kind), "; only strings and ints are read");
      }
      const std::string id = key.kind == PickledValue::Kind::kString
                                 ? "s" + key.text
                                 : "i" + std::to_string(key.integer);
      if (!keys.insert(id).second) {
        fail_at(at, "a dict has the key ",
                key.kind == PickledValue::Kind::kString ? quoted(key.text) : id.substr(1),
                " twice; torch.save writes each key once");
      }
      dict.push_back(key);
      dict.push_back(items[k + 1]);
    }
  }

  void memo_put(std::size_t at, std::uint64_t index) {
    if (stack_.empty()) fail_at(at, "a memo opcode finds the stack empty");
    if (index > memo_.size()) fail_at(at, "memo indices are not assigned in order");
    if (index == memo_.size()) {
      memo_.push_back(stack_.back());
    } else {
      memo_[index] = stack_.back();
    }
  }

  std::vector<Item> stack_;
  std::vector<std::size_t> marks_;
  std::vector<Item> memo_;
  // Every container made, alive until the evaluator ends: dict_keys_ is keyed by address, which a
  // freed container (one a BUILD or a REDUCE dropped) would otherwise pass on to a later one.
  std::vector<PickledValue> containers_;
  // Each dict's keys so far ("s<text>", "i<int>"): a repeated key is refused in O(1).
  std::unordered_map<const void*, std::unordered_set<std::string>> dict_keys_;
  bool accepted_ = false;
};

}  // namespace

PickledValue pickled_scalar(PickledValue::Kind kind, std::int64_t integer, double real,
                            std::string text) {
  PickledValue value;
  value.kind = kind;
  value.integer = integer;
  value.real = real;
  value.text = std::move(text);
  return value;
}

const SavedDtype* saved_dtype(std::string_view name) {
  for (const SavedDtype& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const char* describe_kind(PickledValue::Kind kind) {
  constexpr const char* kNames[] = {"None",    "a bool", "an int", "a float", "a string",
                                    "a tuple", "a list", "a dict", "a tensor"};
  return kNames[static_cast<int>(kind)];
}

PickledValue evaluate_torch_pickle(std::string_view pickle, std::string_view entry_name) {
  return TorchPickleEvaluator(pickle, entry_name).run();
}

}  // namespace amp::detail
