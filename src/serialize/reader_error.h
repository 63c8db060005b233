// The one error type and message style of amp's strict file readers (src/serialize).
//
// Every refusal reads "<file or entry> byte <offset>: <what>": "file byte 1204: ..." for an offset
// into the whole file (zip records), "'archive/data.pkl' byte 5: ..." for an offset into one
// entry (a pickle, a code file). The caller prefixes the file's path and adds the fix.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace amp::detail {

/// Thrown for any file the readers refuse or cannot load.
class ReaderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The location named in refusals whose offset is into the whole file rather than one entry.
inline constexpr std::string_view kWholeFile = "file";

/// `text` as a message quotes it: in single quotes, quotes and backslashes escaped, control and
/// non-ASCII bytes as \xNN, at most 64 bytes then "...". Names come from the file being refused:
/// a message must never carry control bytes or kilobytes of attacker text.
inline std::string quoted(std::string_view text) {
  constexpr std::size_t kMaxShown = 64;
  constexpr const char* kHex = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t k = 0; k < text.size() && k < kMaxShown; ++k) {
    const auto c = static_cast<unsigned char>(text[k]);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out + "'";
}

/// `value` as "0x" and `digits` lowercase hex digits: how opcodes, flags and CRC-32s are shown.
inline std::string hex(std::uint64_t value, int digits) {
  constexpr const char* kHex = "0123456789abcdef";
  std::string out(static_cast<std::size_t>(digits), '0');
  for (int k = digits - 1; k >= 0; --k, value >>= 4) {
    out[static_cast<std::size_t>(k)] = kHex[value & 0xf];
  }
  return "0x" + out;
}

/// Throws ReaderError "<where> byte <offset>: <args...>" (the arguments streamed in order).
/// `where` is kWholeFile or an entry's quoted() name.
template <typename... Args>
[[noreturn]] void fail_at(std::string_view where, std::uint64_t offset, const Args&... args) {
  std::ostringstream message;
  message << where << " byte " << offset << ": ";
  (message << ... << args);
  throw ReaderError(message.str());
}

}  // namespace amp::detail
