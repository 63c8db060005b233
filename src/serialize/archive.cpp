// amp::check_archive and amp::load_archive: the archive checker applied to a file, in front of
// LibTorch's InputArchive.
#include "amp/archive.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "serialize/archive_check.h"

namespace amp {

namespace {

// The file's bytes, mapped read-only for as long as the object lives.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    TORCH_CHECK(fd >= 0, "amp::check_archive: cannot open '", path, "': ", std::strerror(errno),
                "; name an archive written by torch::save or OutputArchive::save_to.");
    struct stat info {};
    const bool stat_ok = ::fstat(fd, &info) == 0;
    const int stat_errno = errno;
    if (!stat_ok || !S_ISREG(info.st_mode)) {
      ::close(fd);
      TORCH_CHECK(stat_ok, "amp::check_archive: cannot read '", path,
                  "': ", std::strerror(stat_errno));
      TORCH_CHECK(false, "amp::check_archive: '", path,
                  "' is not a regular file (a folder, FIFO or device); name an archive file.");
    }
    size_ = static_cast<std::size_t>(info.st_size);
    if (size_ > 0) {
      void* data = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int map_errno = errno;
      ::close(fd);
      TORCH_CHECK(data != MAP_FAILED, "amp::check_archive: cannot map '", path, "' (", size_,
                  " bytes) into memory: ", std::strerror(map_errno));
      data_ = static_cast<const char*>(data);
    } else {
      ::close(fd);
    }
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  std::string_view bytes() const { return {data_ == nullptr ? "" : data_, size_}; }

 private:
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace

void check_archive(const std::string& path) {
  const MappedFile file(path);
  try {
    detail::check_archive(file.bytes());
  } catch (const detail::StateFileError& error) {
    TORCH_CHECK(false, "amp::check_archive: '", path,
                "' is not a readable LibTorch archive (corrupt, truncated, or not written by "
                "torch::save / OutputArchive::save_to): ",
                error.what());
  }
}

torch::serialize::InputArchive load_archive(const std::string& path,
                                            std::optional<c10::Device> device) {
  check_archive(path);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, device);
  } catch (const std::exception& error) {
    detail::rethrow_naming_file(path, error);
  }
  return archive;
}

namespace detail {

void rethrow_naming_file(const std::string& path, const std::exception& error) {
  // c10::Error's what() carries a C++ backtrace; the message alone is what the user needs.
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  const std::string message = c10_error != nullptr ? c10_error->msg() : error.what();
  TORCH_CHECK(false, "cannot load '", path, "': ", message);
}

}  // namespace detail

}  // namespace amp
