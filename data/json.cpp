// nlohmann/json behind tessera's errors: parse errors re-thrown naming the source, repeated keys
// found by the parser's callback, and typed reads of object members.
#include "data/json.h"

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "kernels/check.h"

namespace tessera {
namespace {

// nlohmann's message without its "[json.exception.parse_error.101] " tag.
std::string without_tag(const char* what) {
  std::string s = what;
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  return s;
}

// Finds a key repeated within one object, following the parser's events (objects and arrays
// nest as a stack). Names the enclosing keys in the message: "in "a"."b"".
class RepeatedKeys {
 public:
  explicit RepeatedKeys(const std::string& source) : source_(source) {}

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        frames_.push_back({true, {}, {}});
        break;
      case Json::parse_event_t::array_start:
        frames_.push_back({false, {}, {}});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case Json::parse_event_t::key: {
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second) {
          std::string where;
          for (size_t i = 0; i + 1 < frames_.size(); ++i) {
            if (!frames_[i].object) {
              where += "[]";
              continue;
            }
            if (!where.empty()) where += '.';
            where += Json(frames_[i].key).dump();
          }
          detail::fail(source_, ": ", Json(f.key).dump(), " appears twice in one object",
                       where.empty() ? "" : " (in " + where + ")");
        }
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;  // the current member's
  };
  const std::string& source_;
  std::vector<Frame> frames_;
};

bool is_hex4(std::string_view s) {
  if (s.size() < 4) return false;
  for (size_t i = 0; i < 4; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// Rewrites \uXXXX escapes holding half a surrogate pair without its other half as \ufffd (the same
// length, so the parser's byte offsets stay those of the line). Escapes occur only inside strings
// in valid JSON; what else a backslash starts is left for the parser to report.
std::string replace_lone_surrogate_escapes(std::string_view line) {
  std::string out(line);
  auto code = [&](size_t at) { return is_hex4(std::string_view(out).substr(at)) ? std::stoul(out.substr(at, 4), nullptr, 16) : ~0ul; };
  for (size_t i = 0; i + 1 < out.size();) {
    if (out[i] != '\\') {
      ++i;
      continue;
    }
    if (out[i + 1] != 'u') {
      i += 2;  // \" \\ \n ...: the escaped character cannot start an escape
      continue;
    }
    const unsigned long u = code(i + 2);
    if (u == ~0ul) {
      i += 2;
      continue;
    }
    const bool high = u >= 0xD800 && u <= 0xDBFF, low = u >= 0xDC00 && u <= 0xDFFF;
    if (high && out.compare(i + 6, 2, "\\u") == 0) {
      const unsigned long next = code(i + 8);
      if (next >= 0xDC00 && next <= 0xDFFF) {
        i += 12;  // a pair
        continue;
      }
    }
    if (high || low) out.replace(i + 2, 4, "fffd");
    i += 6;
  }
  return out;
}

template <typename T>
std::optional<T> member(const Json& object, const std::string& key, const std::string& where, const char* expected,
                        bool (Json::*is)() const noexcept) {
  const std::string at = where.empty() ? "" : where + ": ";
  TESSERA_CHECK(object.is_object(), at, "expected a JSON object, got ", json_kind(object));
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  TESSERA_CHECK(((*it).*is)(), at, Json(key).dump(), " must be ", expected, ", got ", json_kind(*it));
  return it->get<T>();
}

}  // namespace

Json parse_json(std::string_view text, const std::string& source) {
  try {
    return Json::parse(text.begin(), text.end(), RepeatedKeys(source));
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number beyond double
    detail::fail(source, source.empty() ? "" : ": ", "malformed JSON: ", without_tag(e.what()));
  }
}

Json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in.good(), "cannot read ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  TESSERA_CHECK(!in.bad(), "cannot read ", path);
  return parse_json(ss.str(), path);
}

Json parse_json_line(std::string_view line) {
  const std::string text = replace_lone_surrogate_escapes(line);
  Json v;
  try {
    v = Json::parse(text);
  } catch (const Json::exception& e) {
    detail::fail("malformed JSON: ", without_tag(e.what()));
  }
  TESSERA_CHECK(v.is_object(), "a line must be one JSON object, got ", json_kind(v));
  return v;
}

std::string json_kind(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number with a fraction or exponent";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::null: return "null";
    default: return "a value of another kind";
  }
}

std::optional<std::string> json_string(const Json& object, const std::string& key, const std::string& where) {
  return member<std::string>(object, key, where, "a string", &Json::is_string);
}

std::optional<int64_t> json_int(const Json& object, const std::string& key, const std::string& where) {
  const std::optional<Json> v = member<Json>(object, key, where, "an integer", &Json::is_number_integer);
  if (!v) return std::nullopt;
  TESSERA_CHECK(!(v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)), where, where.empty() ? "" : ": ",
                Json(key).dump(), " = ", v->dump(), " is out of range");
  return v->get<int64_t>();
}

std::optional<double> json_number(const Json& object, const std::string& key, const std::string& where) {
  return member<double>(object, key, where, "a number", &Json::is_number);
}

std::optional<bool> json_bool(const Json& object, const std::string& key, const std::string& where) {
  return member<bool>(object, key, where, "true or false", &Json::is_boolean);
}

}  // namespace tessera
