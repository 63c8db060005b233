// The one way amp's strict readers load a file: mapped read-only, after checking that it is a
// regular file within the reader's size limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace amp::detail {

/// For MappedFile's `max_size`: any size the address space can map.
inline constexpr std::uint64_t kNoFileSizeLimit = std::numeric_limits<std::uint64_t>::max();

/// A file's bytes, read-only for as long as the object lives. Files up to kCopiedFileSize (every
/// state file) are copied into memory: a copy cannot fault when another process truncates the
/// file meanwhile, where a mapping would raise SIGBUS. Larger ones (archives) are mapped, which
/// keeps them out of the heap. The checks before either keep a FIFO or device from being read.
class MappedFile {
 public:
  /// Opens and maps `path`. Throws ReaderError ("cannot open '<path>': <reason>", "'<path>' is
  /// not a regular file (a folder, FIFO or device)", "'<path>' has N bytes, more than the
  /// `max_size` <kind> may have") when it cannot be opened, examined or mapped, is not a regular
  /// file, or is larger than `max_size`. `kind` names what the file should be ("a state file").
  /// Opening never blocks: a FIFO is opened without waiting for a writer, then refused.
  MappedFile(const std::string& path, std::uint64_t max_size, std::string_view kind);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  /// The file's contents (empty for an empty file).
  std::string_view bytes() const;

  /// Gives the pages of `part` (a view into bytes()) back to the kernel once they are read: a
  /// mapped file's pages are read again from the file if touched later, so a reader that copies
  /// a large entry out piece by piece keeps one copy resident, not two. No-op for a copied file.
  void release(std::string_view part) const;

  /// Files up to this size are copied rather than mapped.
  static constexpr std::uint64_t kCopiedFileSize = std::uint64_t{1} << 20;

 private:
  const char* data_ = nullptr;  // the mapping, or null when copied
  std::size_t size_ = 0;
  std::string copy_;
};

}  // namespace amp::detail
