// Removes a folder and everything in it, without std::filesystem::remove_all (see below).
#pragma once

#include <ftw.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace amp_test {

/// Removes `path` and everything below it; a path that does not exist is not an error. Returns
/// whether nothing is left. Not std::filesystem::remove_all: LibTorch 2.11's libtorch.so exports
/// its own statically linked copy of libstdc++'s std::filesystem (pytorch/pytorch#133437), which
/// programs linking it bind to before libstdc++'s, and that copy's remove_all crashes (a call
/// through a null pointer) on every folder that is not empty. The other std::filesystem calls
/// the tests make work.
inline bool remove_tree(const std::filesystem::path& path) {
  // Depth first, so a folder is emptied before it is removed; std::remove rmdirs folders.
  const auto remove_entry = [](const char* entry, const struct stat*, int, struct FTW*) {
    return std::remove(entry);
  };
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT;
}

}  // namespace amp_test
