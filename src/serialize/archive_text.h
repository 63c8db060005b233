// Small text predicates the archive checker's parts share: prefixes, suffixes, identifiers and
// dotted names as LibTorch's archives spell them.
#pragma once

#include <cstddef>
#include <string_view>

namespace amp::detail::archive_text {

inline bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}
inline bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

inline bool is_identifier(std::string_view text) {
  if (text.empty() || text.size() > 256) return false;
  for (std::size_t k = 0; k < text.size(); ++k) {
    const char c = text[k];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!letter && !(k > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// "a.b.c" with each part an identifier.
inline bool is_dotted_name(std::string_view text) {
  if (text.empty() || text.size() > 1024) return false;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = text.find('.', start);
    if (!is_identifier(text.substr(start, dot == std::string_view::npos ? dot : dot - start))) {
      return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

}  // namespace amp::detail::archive_text
