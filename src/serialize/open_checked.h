// How libamp's readers open a file (archive.cpp, state_dict.cpp): mapped by MappedFile, whose
// refusal becomes a c10::Error naming the reader and saying what to pass instead.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "serialize/mapped_file.h"

namespace amp::detail {

/// The file at `path`, any size. Errors: c10::Error "<who>: <why it cannot be read>; <fix>".
/// `kind` names what the file should be ("an archive").
std::unique_ptr<MappedFile> open_checked(const std::string& path, std::string_view kind,
                                         std::string_view who, std::string_view fix);

}  // namespace amp::detail
