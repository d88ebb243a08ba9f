// The JSON tessera reads (GPT-2's encoder.json, .jsonl lines, Hugging Face config.json and
// safetensors headers), parsed by nlohmann/json (Debian's nlohmann-json3-dev). Key decision: the
// library parses; this adds only what tessera's errors need: every message names its source and
// what was expected, and a key repeated in a file is refused (two readers could take either value).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

using Json = nlohmann::json;

// One JSON document. Errors (tessera::Error): "<source>: malformed JSON: parse error at line L,
// column C: syntax error while parsing ... expected ..." (nlohmann's account of what it expected),
// and "<source>: "key" appears twice in one object (at /path)". Whatever the text holds, the result
// is an Error or a value: never a crash (tests/fuzz/json.cpp).
Json parse_json(std::string_view text, const std::string& source);
// The file at path, parsed as above (source = path); a file that cannot be read is an Error naming it.
Json read_json_file(const std::string& path);

// One line of a .jsonl file, read as Python's json.loads reads it: a repeated key keeps its last
// value, and a \u escape holding half a surrogate pair with no other half becomes U+FFFD (web
// text has them; errors="replace"). It must be an object. Errors name no file: the caller adds
// file:line ("malformed JSON: ...", "a line must be one JSON object").
Json parse_json_line(std::string_view line);

// What a value is, for messages: "an object", "an array", "a string", "an integer", "a number",
// "a boolean", "null".
std::string json_kind(const Json& v);

// The value of `key` in the object `object` as a C++ type, or nothing when the key is absent (or
// null: Hugging Face writes unset options as null). A value of another type is an Error:
// "<where>: "key" must be an integer, got a string". json_int accepts integers within int64 only;
// json_number any number.
std::optional<std::string> json_string(const Json& object, const std::string& key, const std::string& where);
std::optional<int64_t> json_int(const Json& object, const std::string& key, const std::string& where);
std::optional<double> json_number(const Json& object, const std::string& key, const std::string& where);
std::optional<bool> json_bool(const Json& object, const std::string& key, const std::string& where);

}  // namespace tessera
