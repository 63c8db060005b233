// libFuzzer target for the archive checker and the torch.save pickle evaluator behind it: any
// input must pass or be refused with ReaderError; a crash, a sanitizer report, a hang or any other
// exception is a finding.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "serialize/archive_check.h"
#include "serialize/pickle_values.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    amp::detail::check_archive(bytes);
  } catch (const amp::detail::ReaderError&) {
    // A refusal is the expected answer to almost every input.
  }
  // The pickle scanner and the code check alone too: most inputs never reach them through a
  // valid zip. Every tensor record names a data entry of 4 KiB here.
  const amp::detail::ArchiveRecordSize record_size = [](std::string_view name) {
    return name.substr(0, 5) == "data/" ? std::optional<std::uint64_t>(4096) : std::nullopt;
  };
  try {
    amp::detail::check_archive_pickle(bytes, "data.pkl", record_size);
    // What the checker accepts, the torch.save evaluator (amp::load_pickled's) reads or refuses.
    amp::detail::evaluate_torch_pickle(bytes, "data.pkl");
  } catch (const amp::detail::ReaderError&) {
  }
  try {
    amp::detail::check_archive_code(bytes, "code/__torch__.py");
  } catch (const amp::detail::ReaderError&) {
  }
  return 0;
}
