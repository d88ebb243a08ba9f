// The one piece of JSON that `tessera prepare` needs: the string value of a top-level key of one
// JSON object (a line of a .jsonl file). Other values are skipped without being built.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tessera {

// The decoded (UTF-8) string value of `key` in the JSON object `json`, or nothing when the object
// has no such key. Escapes \" \\ \/ \b \f \n \r \t and \uXXXX (surrogate pairs joined; a lone
// surrogate becomes U+FFFD, as Python's errors="replace" would) are decoded. Throws tessera::Error
// with a short description (the caller adds file:line) when json is not an object, the value of
// key is not a string, or the text is malformed.
std::optional<std::string> json_string_field(std::string_view json, std::string_view key);

}  // namespace tessera
