// amp::check_archive and amp::load_archive: the archive checker applied to a file, in front of
// LibTorch's InputArchive.
#include "amp/archive.h"

#include <c10/util/Exception.h>

#include <optional>

#include "serialize/archive_check.h"
#include "serialize/open_checked.h"

namespace amp {

void check_archive(const std::string& path) {
  const auto file = detail::open_checked(path, "an archive", "amp::check_archive",
                                         "name an archive written by torch::save or "
                                         "OutputArchive::save_to.");
  try {
    detail::check_archive(file->bytes());
  } catch (const detail::ReaderError& error) {
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

std::unique_ptr<MappedFile> open_checked(const std::string& path, std::string_view kind,
                                         std::string_view who, std::string_view fix) {
  try {
    return std::make_unique<MappedFile>(path, kNoFileSizeLimit, kind);
  } catch (const ReaderError& error) {
    TORCH_CHECK(false, who, ": ", error.what(), "; ", fix);
  }
}

void rethrow_naming_file(const std::string& path, const std::exception& error) {
  // c10::Error's what() carries a C++ backtrace; the message alone is what the user needs.
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  const std::string message = c10_error != nullptr ? c10_error->msg() : error.what();
  TORCH_CHECK(false, "cannot load '", path, "': ", message);
}

}  // namespace detail

}  // namespace amp
