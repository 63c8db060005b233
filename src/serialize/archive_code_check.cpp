// The archive checker's code part: the line grammar of the TorchScript class definitions in an
// archive's code/*.py entries and of the types they (and the pickles) name (archive_check.h).
#include <string>
#include <string_view>
#include <vector>

#include "serialize/archive_check.h"
#include "serialize/archive_text.h"

namespace amp::detail {

namespace {

using namespace archive_text;

// ---- types ----

class TypeParser {
 public:
  TypeParser(std::string_view text, std::string_view where, std::size_t offset)
      : text_(text), where_(quoted(where)), offset_(offset) {}

  void run() {
    if (text_.size() > 4096) bad("is ", text_.size(), " bytes long; types are at most 4096");
    parse_type(0);
    if (pos_ != text_.size()) bad("has unexpected text at byte ", pos_);
  }

 private:
  template <typename... Args>
  [[noreturn]] void bad(const Args&... args) const {
    fail_at(where_, offset_, "the type ", quoted(text_), " ", args...);
  }

  void parse_type(std::size_t depth) {
    const std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != '[' && text_[pos_] != ']' && text_[pos_] != ',') {
      ++pos_;
    }
    const std::string_view name = text_.substr(start, pos_ - start);
    if (name == "()") return;  // Tuple[()]: the empty tuple
    if (!is_dotted_name(name)) bad("has ", quoted(name), " where a type name should be");
    if (pos_ == text_.size() || text_[pos_] != '[') return;
    if (depth + 1 > kMaxArchiveTypeNesting) {
      bad("nests brackets more than ", kMaxArchiveTypeNesting, " deep");
    }
    ++pos_;
    while (true) {
      parse_type(depth + 1);
      if (pos_ == text_.size()) bad("has an unclosed '['");
      if (text_[pos_] == ']') {
        ++pos_;
        return;
      }
      if (text_[pos_] != ',') bad("has ", quoted(text_.substr(pos_, 1)), " at byte ", pos_);
      ++pos_;
      if (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
    }
  }

  std::string_view text_;
  std::string where_;
  std::size_t offset_;
  std::size_t pos_ = 0;
};

// ---- code ----

// A string literal at `pos` of `line` ("..." with backslash escapes); returns the position after.
std::size_t skip_string_literal(std::string_view line, std::size_t pos) {
  if (pos >= line.size() || line[pos] != '"') return std::string_view::npos;
  for (++pos; pos < line.size(); ++pos) {
    if (line[pos] == '\\') {
      ++pos;
    } else if (line[pos] == '"') {
      return pos + 1;
    }
  }
  return std::string_view::npos;
}

// `[` ("...", )* `]`: the lists of parameter and buffer names.
bool is_name_list(std::string_view text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return false;
  std::size_t pos = 1;
  while (pos < text.size() - 1) {
    pos = skip_string_literal(text, pos);
    if (pos == std::string_view::npos || pos + 2 > text.size() - 1 || text[pos] != ',' ||
        text[pos + 1] != ' ') {
      return false;
    }
    pos += 2;
  }
  return pos == text.size() - 1;
}

}  // namespace

void check_archive_type(std::string_view type, std::string_view where, std::size_t offset) {
  TypeParser(type, where, offset).run();
}

void check_archive_code(std::string_view code, std::string_view entry_name) {
  const std::string where = quoted(entry_name);
  std::size_t start = 0;
  for (std::size_t number = 1; start < code.size(); ++number) {
    std::size_t end = code.find('\n', start);
    if (end == std::string_view::npos) end = code.size();
    const std::string_view line = code.substr(start, end - start);
    const std::size_t line_start = start;
    start = end + 1;
    const auto refuse = [&] {
      fail_at(where, line_start, "line ", number, " is ", quoted(line),
              ", which is not a line LibTorch writes for an archive (only class headers, "
              "__parameters__, __buffers__, __annotations__ and attribute types)");
    };
    if (line.empty()) continue;
    if (starts_with(line, "class ")) {
      const std::size_t open = line.find('(');
      if (open == std::string_view::npos || !ends_with(line, "):") ||
          !is_identifier(line.substr(6, open - 6)) ||
          !is_dotted_name(line.substr(open + 1, line.size() - open - 3))) {
        refuse();
      }
      continue;
    }
    if (!starts_with(line, "  ")) refuse();
    const std::string_view body = line.substr(2);
    const std::size_t body_start = line_start + 2;
    if (starts_with(body, "__parameters__ = ") || starts_with(body, "__buffers__ = ")) {
      if (!is_name_list(body.substr(body.find('=') + 2))) refuse();
    } else if (body == "__annotations__ = []") {
    } else if (starts_with(body, "__annotations__[")) {
      const std::size_t after = skip_string_literal(body, 16);
      if (after == std::string_view::npos || body.substr(after, 4) != "] = ") refuse();
      check_archive_type(body.substr(after + 4), entry_name, body_start + after + 4);
    } else {
      const std::size_t colon = body.find(" : ");
      if (colon == std::string_view::npos || !is_identifier(body.substr(0, colon))) refuse();
      check_archive_type(body.substr(colon + 3), entry_name, body_start + colon + 3);
    }
  }
}

}  // namespace amp::detail
