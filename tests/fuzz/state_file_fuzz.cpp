// libFuzzer target for the state-file reader: any input must parse or be refused with
// ReaderError; a crash, a sanitizer report, a hang or any other exception is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "serialize/state_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    amp::detail::parse_state_file(bytes);
  } catch (const amp::detail::ReaderError&) {
    // A refusal is the expected answer to almost every input.
  }
  // The pickle reader alone too: most inputs never reach it through a valid zip.
  try {
    amp::detail::parse_state_pickle(bytes);
  } catch (const amp::detail::ReaderError&) {
  }
  return 0;
}
