// libFuzzer target for the examples' IDX reader: any bytes, as an in-memory IDX file and as a
// file on disk (raw, or gzip when they start with gzip's magic), must parse or be refused with
// DataError; a crash, a sanitizer report, a hang or any other exception is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "idx.h"

namespace {

// An anonymous in-memory file, named through /proc so the reader opens it like any path.
class MemoryFile {
 public:
  MemoryFile(const std::uint8_t* data, std::size_t size) : fd_(::memfd_create("idx_fuzz", 0)) {
    std::size_t written = 0;
    while (fd_ >= 0 && written < size) {
      const ssize_t n = ::write(fd_, data + written, size - written);
      if (n <= 0) break;
      written += static_cast<std::size_t>(n);
    }
  }
  ~MemoryFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  bool ok() const { return fd_ >= 0; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  for (const std::uint32_t magic : {amp_examples::kIdxImagesMagic, amp_examples::kIdxLabelsMagic}) {
    try {
      amp_examples::parse_idx(bytes, magic, "input");
    } catch (const amp_examples::DataError&) {
    }
  }
  MemoryFile file(data, size);
  if (!file.ok()) return 0;
  for (const std::uint32_t magic : {amp_examples::kIdxImagesMagic, amp_examples::kIdxLabelsMagic}) {
    try {
      amp_examples::read_idx(file.path(), magic);
    } catch (const amp_examples::DataError&) {
    }
  }
  return 0;
}
