// The torch.save pickle writer (pickle_writer.h): one opcode sequence per kind of value.
#include "serialize/pickle_writer.h"

#include <cstdint>
#include <cstring>

#include "serialize/pickle_cursor.h"

namespace amp::detail {

namespace {

using namespace opcode;

class TorchPickleWriter {
 public:
  std::string finish(const PickledValue& value) {
    out_ += static_cast<char>(kProto);
    out_ += '\x02';
    write(value);
    out_ += static_cast<char>(kStop);
    return std::move(out_);
  }

 private:
  void op(unsigned char code) { out_ += static_cast<char>(code); }
  void little_endian(std::uint64_t value, int bytes) {
    for (int k = 0; k < bytes; ++k) out_ += static_cast<char>((value >> (8 * k)) & 0xff);
  }
  void global(const char* module, const char* name) {
    op(kGlobal);
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }
  void string(const std::string& text) {
    op(kBinUnicode);
    little_endian(text.size(), 4);
    out_ += text;
  }
  void integer(std::int64_t value) {
    if (value >= 0 && value < 256) {
      op(kBinInt1);
      little_endian(static_cast<std::uint64_t>(value), 1);
    } else if (value >= 0 && value < 65536) {
      op(kBinInt2);
      little_endian(static_cast<std::uint64_t>(value), 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      op(kBinInt);
      little_endian(static_cast<std::uint32_t>(static_cast<std::int32_t>(value)), 4);
    } else {
      op(kLong1);  // 8 bytes of two's complement, little-endian
      out_ += '\x08';
      little_endian(static_cast<std::uint64_t>(value), 8);
    }
  }
  void real(double value) {
    op(kBinFloat);  // big-endian IEEE double
    std::uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    for (int k = 7; k >= 0; --k) out_ += static_cast<char>((bits >> (8 * k)) & 0xff);
  }
  void tuple_of_ints(const std::vector<std::int64_t>& values) {
    op(kMark);
    for (std::int64_t v : values) integer(v);
    op(kTuple);
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    op(kEmptyTuple);
    op(kReduce);
  }

  void tensor(const PickledTensor& t) {
    const SavedDtype* dtype = saved_dtype(t.dtype);
    if (dtype == nullptr) {
      throw ReaderError("a tensor of dtype " + t.dtype +
                        " cannot be written: torch.save has no "
                        "record for it");
    }
    global("torch._utils", dtype->typed_storage ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    op(kMark);
    // The persistent id: ('storage', <type>, key, location, count), the count in bytes when
    // the storage is untyped.
    op(kMark);
    string("storage");
    if (dtype->typed_storage) {
      global("torch", dtype->global);
    } else {
      global("torch.storage", "UntypedStorage");
    }
    string(t.key);
    string(t.location);
    integer(static_cast<std::int64_t>(
        dtype->typed_storage ? t.storage_numel : t.storage_numel * dtype->element_size));
    op(kTuple);
    op(kBinPersId);
    integer(t.offset);
    tuple_of_ints(t.sizes);
    tuple_of_ints(t.strides);
    op(t.requires_grad ? kNewTrue : kNewFalse);
    empty_ordered_dict();  // backward hooks
    if (!dtype->typed_storage) global("torch", dtype->global);
    op(kTuple);
    op(kReduce);
  }

  void items(const std::vector<PickledValue>& values) {
    for (const PickledValue& value : values) write(value);
  }
  // APPENDS or SETITEMS of `values` after MARK; nothing for none (an empty list or dict).
  void appended(const std::vector<PickledValue>& values, unsigned char code) {
    if (values.empty()) return;
    op(kMark);
    items(values);
    op(code);
  }

  void write(const PickledValue& value) {
    using Kind = PickledValue::Kind;
    switch (value.kind) {
      case Kind::kNone:
        op(kNone);
        return;
      case Kind::kBool:
        op(value.integer != 0 ? kNewTrue : kNewFalse);
        return;
      case Kind::kInt:
        integer(value.integer);
        return;
      case Kind::kFloat:
        real(value.real);
        return;
      case Kind::kString:
        string(value.text);
        return;
      case Kind::kTuple:
        op(kMark);
        items(*value.items);
        op(kTuple);
        return;
      case Kind::kList:
        op(kEmptyList);
        appended(*value.items, kAppends);
        return;
      case Kind::kDict:
        if (value.ordered_dict) {
          empty_ordered_dict();
        } else {
          op(kEmptyDict);
        }
        appended(*value.items, kSetItems);
        return;
      case Kind::kTensor:
        tensor(*value.tensor);
        return;
    }
  }

  std::string out_;
};

}  // namespace

std::string write_torch_pickle(const PickledValue& value) {
  return TorchPickleWriter().finish(value);
}

}  // namespace amp::detail
