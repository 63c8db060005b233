// Checks a torch::serialize archive file before LibTorch's reader parses it.
//
// An archive (OutputArchive::save_to, torch::save) is a zip of a TorchScript module: data.pkl
// (the attributes, pickled), code/*.py (the attribute types, as TorchScript class definitions),
// data/<n> (tensor bytes) and a few small records. LibTorch's reader trusts all of it: a damaged
// or hostile file can crash it (unknown storage types, nesting a million deep, zip sizes past the
// file), hang it (memo indices of 2^28) or make it allocate gigabytes. This checker accepts what
// LibTorch's writer produces and refuses, with a sentence naming the entry and byte, whatever
// could reach one of those paths. It runs in time and memory proportional to the pickles and
// code it reads (tensor bytes are bounds-checked, not read). Standard C++ and zlib (for deflated
// code entries) only, so that the fuzzer builds it without LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "serialize/reader_error.h"
#include "serialize/zip_directory.h"

namespace amp::detail {

/// The largest pickle entry (data.pkl, constants.pkl, *.debug_pkl) read, in bytes.
constexpr std::size_t kMaxArchivePickleSize = std::size_t{64} << 20;
/// The largest code/*.py entry read, in bytes after decompression.
constexpr std::size_t kMaxArchiveCodeSize = std::size_t{16} << 20;
/// The largest other record LibTorch reads whole (version, byteorder, .data/*), in bytes.
constexpr std::size_t kMaxArchiveRecordSize = std::size_t{1} << 20;
/// The deepest nesting of values (containers, objects, MARKs) a pickle may build.
constexpr std::size_t kMaxArchiveNesting = 100;
/// The deepest nesting of brackets in a type (`List[Dict[str, Tensor]]` is 2).
constexpr std::size_t kMaxArchiveTypeNesting = 16;
/// The most dimensions a tensor record may have.
constexpr std::size_t kMaxArchiveTensorDims = 64;

/// The size in bytes of the zip entry holding tensor data `name` (e.g. "data/0", relative to the
/// archive's directory), or nullopt when there is none.
using ArchiveRecordSize = std::function<std::optional<std::uint64_t>(std::string_view name)>;

/// Checks a whole archive file (`file`: its bytes, typically mapped). Throws ReaderError saying
/// what is wrong and where. Accepts: a zip (read_archive_directory: every entry under one
/// directory `<d>/`, names unique, a `<d>/data.pkl`), each entry stored (method 0) or deflated
/// (method 8, then at most kMaxArchiveCodeSize bytes after inflating); every `*.pkl` and
/// `*.debug_pkl` entry stored, at most kMaxArchivePickleSize bytes, its CRC-32 right, and
/// accepted by check_archive_pickle; every `<d>/code/**.py` entry accepted by
/// check_archive_code after inflating, its CRC-32 right; `<d>/version` a decimal number; tensor
/// data entries (`<d>/data/*`, `<d>/constants/*`) stored.
/// Returns the archive's directory, for a reader that goes on to read the entries it checked.
ArchiveDirectory check_archive(std::string_view file);

/// Checks one pickle of an archive (`entry_name` is used in messages). Accepts protocols 2 to 5
/// with the opcodes LibTorch's pickler writes: PROTO, FRAME, STOP, MARK, memo opcodes (indices
/// assigned in order from 0, as picklers do), NONE, NEWTRUE/NEWFALSE, BININT*, LONG1 (8 bytes at
/// most), BINFLOAT, BINUNICODE and SHORT_BINUNICODE (UTF-8), EMPTY_TUPLE, TUPLE, TUPLE1-3,
/// EMPTY_LIST, APPEND(S), EMPTY_DICT, SETITEM(S), GLOBAL, NEWOBJ, BUILD, REDUCE and BINPERSID.
/// GLOBAL only names `__torch__` classes, `torch.<X>Storage` of the dtypes LibTorch saves,
/// `torch.storage.UntypedStorage` and the `torch.<dtype>`s (float8, uint16-64) that Python's
/// torch.save writes with it, `torch._utils._rebuild_tensor_v2` and `_v3`,
/// `collections.OrderedDict` and the list builders and `restore_type_tag` of `torch.jit._pickle`;
/// REDUCE calls only those functions, with arguments of the right kinds; BUILD gives state to an
/// object or a dict of attributes to an OrderedDict (a module state_dict's `_metadata`). A tensor
/// record (BINPERSID) must name a storage type, a data entry that `record_size` knows and that
/// holds its elements, and a device like "cpu" or "cuda:1"; a rebuilt tensor's sizes and strides
/// must stay inside its storage. Values nest at most kMaxArchiveNesting deep, and a container may
/// not change once it is inside another (that would let nesting grow unseen). Type strings must
/// pass check_archive_type.
void check_archive_pickle(std::string_view pickle, std::string_view entry_name,
                          const ArchiveRecordSize& record_size);

/// Checks one code/*.py entry: the TorchScript class definitions LibTorch writes for an archive's
/// modules and nothing else. Each line is empty, `class <name>(<name>):`, or, indented by two
/// spaces, `__parameters__ = [...]` or `__buffers__ = [...]` (lists of string literals),
/// `__annotations__ = []`, `__annotations__["<key>"] = <type>` or `<name> : <type>`, types
/// passing check_archive_type. Refuses any other line (methods, expressions) by its number.
void check_archive_code(std::string_view code, std::string_view entry_name);

/// Checks a TorchScript type as the archive spells it: dotted names, optionally followed by
/// `[...]` with comma-separated types (or `()` for the empty tuple), brackets nested at most
/// kMaxArchiveTypeNesting deep. Throws ReaderError naming entry `where` and byte `offset` (where
/// the type stands in that entry).
void check_archive_type(std::string_view type, std::string_view where, std::size_t offset = 0);

}  // namespace amp::detail
