// MappedFile: open without blocking, fstat, refuse what is not a regular file within the limit,
// then copy a small file or map a large one.
#include "serialize/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "serialize/reader_error.h"

namespace amp::detail {

MappedFile::MappedFile(const std::string& path, std::uint64_t max_size, std::string_view kind) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer before the check
  // below could refuse it. It changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  // These refusals are about the path, not a byte of the file: they name the path alone.
  if (fd < 0) throw ReaderError("cannot open '" + path + "': " + std::strerror(errno));
  struct stat info {};
  const bool stat_ok = ::fstat(fd, &info) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(info.st_mode) || static_cast<std::uint64_t>(info.st_size) > max_size) {
    ::close(fd);
    if (!stat_ok) throw ReaderError("cannot read '" + path + "': " + std::strerror(stat_errno));
    if (!S_ISREG(info.st_mode)) {
      throw ReaderError("'" + path + "' is not a regular file (a folder, FIFO or device)");
    }
    throw ReaderError("'" + path + "' has " + std::to_string(info.st_size) +
                      " bytes, more than the " + std::to_string(max_size) + " " +
                      std::string(kind) + " may have");
  }
  size_ = static_cast<std::size_t>(info.st_size);
  if (size_ == 0) {
    ::close(fd);
    return;
  }
  if (size_ <= kCopiedFileSize) {
    copy_.resize(size_);
    std::size_t done = 0;
    while (done < size_) {
      const ssize_t got = ::pread(fd, copy_.data() + done, size_ - done, static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        const int read_errno = errno;
        ::close(fd);
        throw ReaderError("cannot read '" + path + "': " + std::strerror(read_errno));
      }
      if (got == 0) break;  // truncated meanwhile: the reader refuses the shorter contents
      done += static_cast<std::size_t>(got);
    }
    ::close(fd);
    copy_.resize(done);
    size_ = done;
    return;
  }
  void* data = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (data == MAP_FAILED) {
    throw ReaderError("cannot map '" + path + "' (" + std::to_string(size_) +
                      " bytes) into memory: " + std::strerror(map_errno));
  }
  data_ = static_cast<const char*>(data);
}

std::string_view MappedFile::bytes() const {
  if (data_ == nullptr) return copy_;
  return {data_, size_};
}

void MappedFile::release(std::string_view part) const {
  if (data_ == nullptr || part.empty()) return;
  // Whole pages inside `part` only: the pages at its ends may hold bytes still to be read.
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(part.data()) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(part.data()) + part.size()) / page * page;
  const auto first = reinterpret_cast<std::uintptr_t>(data_);
  if (begin < first || end > first + size_ || end <= begin) return;
  // The mapping is private and read-only, never written: dropped pages come back from the file.
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace amp::detail
