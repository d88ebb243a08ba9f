// Config parsing, overrides, validation and rendering. Every operation is a small visitor over
// Config::visit, so a field's name, type, doc and allowed values live in config.h only; errors
// are thrown one at a time (the first in file order), each naming the key and file:line.
#include "app/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <type_traits>

#include "app/auto_layout.h"
#include "app/memory_check.h"
#include "app/token_batching.h"
#include "data/tokenizer.h"
#include "data/unicode_class.h"
#include "kernels/check.h"
#include "model/compression_policy.h"
#include "model/gpt.h"
#include "model/memory.h"
#include "model/recompute_ops.h"
#include "parallel/tp_overlap.h"
#include "parallel/tp_compression.h"

namespace tessera {

// ---- Allowed -------------------------------------------------------------------------------

Allowed Allowed::at_least(double lo) {
  Allowed a;
  a.min = lo;
  return a;
}

Allowed Allowed::greater_than(double lo) {
  Allowed a = at_least(lo);
  a.min_exclusive = true;
  return a;
}

Allowed Allowed::closed(double lo, double hi) {
  Allowed a = at_least(lo);
  a.max = hi;
  return a;
}

Allowed Allowed::half_open(double lo, double hi) {
  Allowed a = closed(lo, hi);
  a.max_exclusive = true;
  return a;
}

Allowed Allowed::one_of(std::vector<std::string> values) {
  Allowed a;
  a.choices = std::move(values);
  return a;
}

Allowed Allowed::or_value(double v) const {
  Allowed a = *this;
  a.sentinel = v;
  return a;
}

Allowed Allowed::or_ending(std::string suffix) const {
  Allowed a = *this;
  a.or_suffix = std::move(suffix);
  return a;
}

Allowed Allowed::at_most(double hi) const {
  Allowed a = *this;
  a.max = hi;
  a.max_exclusive = false;
  return a;
}

bool Allowed::accepts(double v) const {
  if (!std::isfinite(v)) return false;  // inf passes every "> 0"; nan compares false with everything
  if (sentinel && v == *sentinel) return true;
  if (min && !(min_exclusive ? v > *min : v >= *min)) return false;
  if (max && !(max_exclusive ? v < *max : v <= *max)) return false;
  return true;
}

bool Allowed::accepts(const std::string& s) const {
  if (!or_suffix.empty() && s.size() >= or_suffix.size() && s.ends_with(or_suffix)) return true;
  return choices.empty() || std::find(choices.begin(), choices.end(), s) != choices.end();
}

namespace {

// Shortest text that reads back as the same double, always a TOML float ("10000.0", "3e-4").
std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  const size_t e = s.find('e');
  if (e != std::string::npos) {  // "1e-08" -> "1e-8", "1e+06" -> "1e6"
    std::string sign = s[e + 1] == '-' ? "-" : "";
    size_t digits = s.find_first_not_of("+-0", e + 1);
    return s.substr(0, e + 1) + sign + (digits == std::string::npos ? "0" : s.substr(digits));
  }
  if (s.find_first_of(".n") == std::string::npos) s += ".0";  // "n": inf, nan
  return s;
}

// A bound as people write it: 1 rather than 1.0.
std::string format_bound(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return format_double(v);
}

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04X", c);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

std::string Allowed::describe() const {
  if (!choices.empty()) {
    std::string s = "one of ";
    for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + quote(choices[i]);
    if (!or_suffix.empty()) s += ", or a path ending in " + quote(or_suffix);
    return s;
  }
  std::string range;
  if (min && max) {
    range = std::string("in ") + (min_exclusive ? "(" : "[") + format_bound(*min) + ", " + format_bound(*max) +
            (max_exclusive ? ")" : "]");
  } else if (min) {
    range = (min_exclusive ? "> " : ">= ") + format_bound(*min);
  } else if (max) {
    range = (max_exclusive ? "< " : "<= ") + format_bound(*max);
  }
  if (sentinel) return format_bound(*sentinel) + (range.empty() ? "" : " or " + range);
  return range;
}

namespace {

// ---- Values as TOML text -------------------------------------------------------------------

std::string literal(int64_t v) { return std::to_string(v); }
std::string literal(double v) { return format_double(v); }
std::string literal(bool v) { return v ? "true" : "false"; }
std::string literal(const std::string& v) { return quote(v); }
std::string literal(const std::vector<int64_t>& v) {  // an inline array: [4, 4, 3, 1]
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}
std::string literal(const std::vector<std::string>& v) {  // an inline array: ["vision.*", "lm.*"]
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + quote(v[i]);
  return out + "]";
}
std::string literal(const std::vector<DataSource>& v) {  // an inline array of inline tables
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? ", " : "") + std::string("{ path = ") + quote(v[i].path) + ", weight = " + format_double(v[i].weight) + " }";
  return out + "]";
}

template <class T>
std::string_view type_name() {
  if constexpr (std::is_same_v<T, int64_t>) return "integer";
  if constexpr (std::is_same_v<T, double>) return "float";
  if constexpr (std::is_same_v<T, bool>) return "boolean";
  if constexpr (std::is_same_v<T, std::string>) return "string";
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "array of integers";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "array of strings";
  if constexpr (std::is_same_v<T, std::vector<DataSource>>) return "array of tables";
}

template <class T>
std::string_view expected_type() {
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  if constexpr (std::is_same_v<T, double>) return "a number";
  if constexpr (std::is_same_v<T, bool>) return "a boolean (true or false)";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "an array of integers, e.g. [4, 4]";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "an array of strings, e.g. [\"wte.*\", \"original\"]";
  if constexpr (std::is_same_v<T, std::vector<DataSource>>)
    return "tables with a path (string) and a weight (> 0): [[data.train]] path = \"...\" weight = 1.0";
}

// "string \"abc\"", "integer 5", "a table": what a user wrote, for type errors.
std::string describe_node(const toml::node& n) {
  if (auto s = n.as_string()) return "string " + quote(s->get());
  if (auto i = n.as_integer()) return "integer " + literal(i->get());
  if (auto f = n.as_floating_point()) return "float " + literal(f->get());
  if (auto b = n.as_boolean()) return "boolean " + literal(b->get());
  if (n.is_table()) return "a table";
  if (n.is_array()) return "an array";
  std::ostringstream os;
  os << n.type();
  return os.str();
}

// ---- Suggestions ---------------------------------------------------------------------------

// Optimal-string-alignment distance: Levenshtein plus adjacent transpositions ("stpes" -> 1).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The closest candidate when it is close enough to be a typo: within a third of the word's length
// (at least 1 edit, at most 3).
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates) {
  const size_t limit = std::clamp<size_t>(word.size() / 3, 1, 3);
  std::optional<std::string> best;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

// ---- The field table -----------------------------------------------------------------------

// Calls visit() on each section with the section's name current.
template <class Derived>
class Walker {
 public:
  template <class S>
  void section(std::string_view name, std::string_view doc, S& s) {
    section_ = name;
    static_cast<Derived&>(*this).begin_section(name, doc);
    s.visit(static_cast<Derived&>(*this));
  }
  void begin_section(std::string_view, std::string_view) {}

 protected:
  std::string full(std::string_view key) const { return section_ + "." + std::string(key); }
  std::string section_;
};

struct FieldInfo {
  std::string key, doc, type, value;  // value: the current one, as TOML
  Allowed allowed;
};

struct SectionInfo {
  std::string name, doc;
  std::vector<FieldInfo> fields;
};

// Flattens a Config into its sections and fields (names, docs, types, values, allowed values).
class Catalog : public Walker<Catalog> {
 public:
  void begin_section(std::string_view name, std::string_view doc) {
    sections.push_back({std::string(name), std::string(doc), {}});
  }
  template <class T>
  void field(std::string_view key, T& value, std::string_view doc, const Allowed& allowed) {
    sections.back().fields.push_back(
        {std::string(key), std::string(doc), std::string(type_name<T>()), literal(value), allowed});
  }
  std::vector<SectionInfo> sections;
};

std::vector<SectionInfo> catalog(Config c) {
  Catalog cat;
  c.visit(cat);
  return cat.sections;
}

const SectionInfo* find_section(const std::vector<SectionInfo>& table, std::string_view name) {
  for (const auto& s : table) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

bool has_field(const SectionInfo& s, std::string_view key) {
  return std::any_of(s.fields.begin(), s.fields.end(), [&](const FieldInfo& f) { return f.key == key; });
}

std::vector<std::string> section_names(const std::vector<SectionInfo>& table) {
  std::vector<std::string> names;
  for (const auto& s : table) names.push_back(s.name);
  return names;
}

std::vector<std::string> field_keys(const SectionInfo& s) {
  std::vector<std::string> keys;
  for (const auto& f : s.fields) keys.push_back(f.key);
  return keys;
}

// The section that has this key, for a key written in the wrong place ("train.lr" -> optim.lr).
const SectionInfo* section_with_key(const std::vector<SectionInfo>& table, std::string_view key) {
  for (const auto& s : table) {
    if (has_field(s, key)) return &s;
  }
  return nullptr;
}

// ---- Where a value came from, and errors that say so ----------------------------------------

// A position in a config file, or a --set argument.
struct Origin {
  std::string file;
  int64_t line = 0;
  std::string set_arg;

  static Origin at(const std::string& file, int64_t line) { return {file, line, ""}; }
  static Origin set(const std::string& arg) { return {"", 0, arg}; }
  // " in configs/x.toml:4" (files); messages about a --set start with prefix() instead.
  std::string where() const { return file.empty() ? "" : " in " + position(); }
  std::string prefix() const { return set_arg.empty() ? "" : "--set " + set_arg + ": "; }
  std::string position() const {
    if (!set_arg.empty()) return "--set " + set_arg;
    return line > 0 ? file + ":" + std::to_string(line) : file;
  }
};

// Where each key ("optim.lr") got its value; keys not listed kept their default.
using Origins = std::map<std::string, std::string>;

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

std::string did_you_mean(const std::optional<std::string>& s) { return s ? "; did you mean " + *s + "?" : ""; }

[[noreturn]] void unknown_section(const std::vector<SectionInfo>& table, const std::string& name, const Origin& o) {
  auto near = nearest(name, section_names(table));
  fail(o.prefix() + "unknown section [" + name + "]" + o.where() +
       did_you_mean(near ? std::optional("[" + *near + "]") : std::nullopt));
}

[[noreturn]] void unknown_key(const std::vector<SectionInfo>& table, const SectionInfo& s, const std::string& key,
                              const Origin& o) {
  std::optional<std::string> hint;
  if (auto near = nearest(key, field_keys(s))) {
    hint = s.name + "." + *near;
  } else if (auto other = section_with_key(table, key)) {
    hint = other->name + "." + key;
  }
  fail(o.prefix() + "unknown key " + s.name + "." + key + o.where() + did_you_mean(hint));
}

[[noreturn]] void wrong_type(const std::string& full, std::string_view expected, const std::string& given,
                             const Origin& o) {
  fail(o.prefix() + "wrong type for " + full + o.where() + ": expected " + std::string(expected) + ", got " + given);
}

template <class T>
void check_allowed(const std::string& full, const T& v, const Allowed& allowed, const Origin& o) {
  if constexpr (std::is_same_v<T, std::vector<DataSource>>) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i].path.empty()) fail(o.prefix() + full + "[" + std::to_string(i) + "].path" + o.where() + " is empty");
      if (!(v[i].weight > 0) || !std::isfinite(v[i].weight))
        fail(o.prefix() + full + "[" + std::to_string(i) + "].weight = " + format_double(v[i].weight) + o.where() +
             " must be > 0");
    }
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    for (size_t i = 0; i < v.size(); ++i)
      if (!allowed.accepts(static_cast<double>(v[i])))
        fail(o.prefix() + full + "[" + std::to_string(i) + "] = " + literal(v[i]) + o.where() +
             " is out of range: must be " + allowed.describe());
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].empty()) fail(o.prefix() + full + "[" + std::to_string(i) + "]" + o.where() + " is empty");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (allowed.accepts(v)) return;
    auto near = nearest(v, allowed.choices);
    fail(o.prefix() + full + " = " + literal(v) + o.where() + " is not allowed: must be " + allowed.describe() +
         did_you_mean(near ? std::optional(quote(*near)) : std::nullopt));
  } else if constexpr (!std::is_same_v<T, bool>) {
    if (allowed.accepts(static_cast<double>(v))) return;
    const std::string range = allowed.describe();
    if (!std::isfinite(static_cast<double>(v)))
      fail(o.prefix() + full + " = " + literal(v) + o.where() + " is not a finite number: must be " +
           (range.empty() ? "finite" : "finite and " + range));
    fail(o.prefix() + full + " = " + literal(v) + o.where() + " is out of range: must be " + range);
  }
}

// ---- Assigning one value -------------------------------------------------------------------

// A value to assign: a parsed TOML node, and for --set also the raw text, which string fields take
// verbatim when it is not a TOML string (--set model.preset=llama).
struct Input {
  const toml::node* node = nullptr;
  std::optional<std::string> raw;
};

std::string describe_input(const Input& in) {
  return in.node ? describe_node(*in.node) : "`" + in.raw.value_or("") + "` (not a TOML value)";
}

std::optional<int64_t> convert(const Input& in, int64_t*) {
  if (in.node && in.node->is_integer()) return in.node->as_integer()->get();
  return std::nullopt;
}

std::optional<double> convert(const Input& in, double*) {
  if (in.node && in.node->is_floating_point()) return in.node->as_floating_point()->get();
  if (in.node && in.node->is_integer()) return static_cast<double>(in.node->as_integer()->get());
  return std::nullopt;
}

std::optional<bool> convert(const Input& in, bool*) {
  if (in.node && in.node->is_boolean()) return in.node->as_boolean()->get();
  return std::nullopt;
}

std::optional<std::string> convert(const Input& in, std::string*) {
  if (in.node && in.node->is_string()) return in.node->as_string()->get();
  return in.raw;
}

// An array of integers (empty allowed).
std::optional<std::vector<int64_t>> convert(const Input& in, std::vector<int64_t>*) {
  if (!in.node || !in.node->is_array()) return std::nullopt;
  std::vector<int64_t> out;
  for (const toml::node& item : *in.node->as_array()) {
    if (!item.is_integer()) return std::nullopt;
    out.push_back(item.as_integer()->get());
  }
  return out;
}

// An array of strings (empty allowed).
std::optional<std::vector<std::string>> convert(const Input& in, std::vector<std::string>*) {
  if (!in.node || !in.node->is_array()) return std::nullopt;
  std::vector<std::string> out;
  for (const toml::node& item : *in.node->as_array()) {
    if (!item.is_string()) return std::nullopt;
    out.push_back(item.as_string()->get());
  }
  return out;
}

// An array of tables, each with a string "path" and an optional numeric "weight", nothing else.
std::optional<std::vector<DataSource>> convert(const Input& in, std::vector<DataSource>*) {
  if (!in.node || !in.node->is_array()) return std::nullopt;
  std::vector<DataSource> out;
  for (const toml::node& item : *in.node->as_array()) {
    const toml::table* t = item.as_table();
    if (!t) return std::nullopt;
    DataSource d;
    for (auto&& [k, v] : *t) {
      if (k.str() == "path" && v.is_string()) {
        d.path = v.as_string()->get();
      } else if (k.str() == "weight" && (v.is_floating_point() || v.is_integer())) {
        d.weight = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
      } else {
        return std::nullopt;
      }
    }
    out.push_back(d);
  }
  return out;
}

// Sets the one field named section.key from an Input, checking type and allowed values.
class Assigner : public Walker<Assigner> {
 public:
  Assigner(std::string_view section, std::string_view key, const Input& input, const Origin& origin)
      : target_section_(section), target_key_(key), input_(input), origin_(origin) {}

  template <class T>
  void field(std::string_view key, T& value, std::string_view, const Allowed& allowed) {
    if (section_ != target_section_ || key != target_key_) return;
    std::optional<T> v = convert(input_, static_cast<T*>(nullptr));
    if (!v) wrong_type(full(key), expected_type<T>(), describe_input(input_), origin_);
    check_allowed(full(key), *v, allowed, origin_);
    value = *v;
  }

 private:
  std::string_view target_section_, target_key_;
  const Input& input_;
  const Origin& origin_;
};

void assign(Config& c, const std::string& section, const std::string& key, const Input& input, const Origin& o,
            Origins& origins) {
  Assigner a(section, key, input, o);
  c.visit(a);
  origins[section + "." + key] = o.position();
}

// ---- Reading a file ------------------------------------------------------------------------

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& pos = e.source().begin;
    fail("TOML syntax error in " + source + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column) + ": " +
         std::string(e.description()));
  }
}

int64_t line_of(const toml::key& k, const toml::node& n) {
  return k.source().begin.line > 0 ? k.source().begin.line : n.source().begin.line;
}

// One top-level entry or one key of a section, so that problems are reported in file order.
struct Entry {
  int64_t line;
  std::string section;
  std::string key;
  const toml::node* node;
  bool top_level;  // a top-level entry that is not a known section table: always an error
};

std::vector<Entry> entries_in_file_order(const toml::table& root, const std::vector<SectionInfo>& table) {
  std::vector<Entry> entries;
  for (auto&& [k, node] : root) {
    const std::string name(k.str());
    const bool descend = find_section(table, name) && node.is_table();
    if (!descend) {
      entries.push_back({line_of(k, node), name, "", &node, true});
      continue;
    }
    for (auto&& [k2, node2] : *node.as_table()) {
      entries.push_back({line_of(k2, node2), name, std::string(k2.str()), &node2, false});
    }
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.line < b.line; });
  return entries;
}

// A top-level entry that is not a known [section] table.
[[noreturn]] void bad_top_level(const std::vector<SectionInfo>& table, const Entry& e, const Origin& o) {
  if (find_section(table, e.section)) wrong_type(e.section, "a table ([" + e.section + "])", describe_node(*e.node), o);
  if (e.node->is_table()) unknown_section(table, e.section, o);
  const SectionInfo* owner = section_with_key(table, e.section);
  fail("unknown key " + e.section + o.where() + " outside any [section]" +
       did_you_mean(owner ? std::optional(owner->name + "." + e.section) : std::nullopt));
}

void apply_file(Config& c, const toml::table& root, const std::string& source, Origins& origins) {
  const auto table = catalog(c);
  for (const Entry& e : entries_in_file_order(root, table)) {
    const Origin o = Origin::at(source, e.line);
    if (e.top_level) bad_top_level(table, e, o);
    const SectionInfo& s = *find_section(table, e.section);
    if (!has_field(s, e.key)) unknown_key(table, s, e.key, o);
    assign(c, e.section, e.key, Input{e.node, std::nullopt}, o, origins);
  }
}

// ---- --set overrides -----------------------------------------------------------------------

std::string trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

bool is_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  for (Utf8Char ch{}; p < end; p += ch.length) {
    ch = decode_utf8(p, end);
    if (!ch.valid) return false;
  }
  return true;
}

// The raw text parsed as a single TOML value, or nothing when it is not one.
std::optional<toml::table> parse_value(const std::string& raw) {
  try {
    toml::table t = toml::parse("value = " + raw);
    if (t.size() == 1 && t.contains("value")) return t;
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

void apply_override(Config& c, const std::string& arg, Origins& origins) {
  const Origin o = Origin::set(arg);
  const auto table = catalog(c);
  const size_t eq = arg.find('=');
  const std::string name = trim(std::string_view(arg).substr(0, eq));
  const size_t dot = name.find('.');
  if (eq == std::string::npos || dot == std::string::npos) {
    const SectionInfo* owner = section_with_key(table, name);
    fail(o.prefix() + "expected section.key=value, e.g. train.steps=100" +
         did_you_mean(owner ? std::optional(owner->name + "." + name) : std::nullopt));
  }
  const std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  const SectionInfo* s = find_section(table, section);
  if (!s) unknown_section(table, section, o);
  if (!has_field(*s, key)) unknown_key(table, *s, key, o);
  const std::string raw = trim(std::string_view(arg).substr(eq + 1));
  const auto parsed = parse_value(raw);
  // Not TOML: a string field takes the text verbatim, and TOML (to_toml: the run's config.toml,
  // the checkpoint's stored config) can only hold UTF-8 text.
  if (!parsed && !is_utf8(raw)) fail(o.prefix() + name + " is not valid UTF-8 text");
  assign(c, section, key, Input{parsed ? parsed->get("value") : nullptr, raw}, o, origins);
}

// ---- Validation ----------------------------------------------------------------------------

// Re-checks every field against its Allowed (for Configs built in code rather than parsed).
class RangeChecker : public Walker<RangeChecker> {
 public:
  template <class T>
  void field(std::string_view key, T& value, std::string_view, const Allowed& allowed) {
    check_allowed(full(key), value, allowed, Origin{});
  }
};

// "optim.lr = 0.001 (configs/x.toml:7)", "(default)" when the key kept its default.
template <class T>
std::string show(const std::string& full, const T& value, const Origins* origins) {
  std::string s = full + " = " + literal(value);
  if (!origins) return s;
  auto it = origins->find(full);
  return s + " (" + (it == origins->end() ? "default" : it->second) + ")";
}

// The model's own validation (model/config.h resolve()), minus TESSERA_CHECK's " [file.cpp:N]"
// suffix, which means nothing to someone editing a config file.
void check_model(const Config& c) {
  try {
    // vocab_size = 0 takes the data's, unknown here: the largest allowed stands in (the trainer
    // checks vision.placeholder_id against the data's vocabulary and placeholder).
    to_model_config(c, c.model.vocab_size > 0 ? c.model.vocab_size : static_cast<int64_t>(kMaxVocab));
  } catch (const Error& e) {
    std::string m = e.what();
    const size_t at = m.rfind(" [");
    if (at != std::string::npos && m.back() == ']') m.erase(at);
    fail("invalid [model]: " + m);
  }
}

// The sizes the config implies, computed with checked arithmetic before anything uses them: the
// tokens of the whole run and one rank's memory estimate (app/memory_check.h,
// at the largest vocabulary a tokenizer gives when model.vocab_size = 0). Every size the trainer
// later computes is at most one of these.
void check_sizes(const Config& c, const Origins* origins) {
  try {
    checked_mul(checked_mul(c.train.steps, c.train.global_batch), c.train.seq_len);
  } catch (const SizeOverflow&) {
    fail(show("train.steps", c.train.steps, origins) + " x " + show("train.global_batch", c.train.global_batch, origins) +
         " x " + show("train.seq_len", c.train.seq_len, origins) + " tokens overflow a 64-bit count; lower train.steps");
  }
  try {
    const int64_t vocab = c.model.vocab_size > 0 ? c.model.vocab_size : kGpt2VocabSize;
    Config smallest = c;  // an automatic micro-batch can always be 1 (the trainer skips sizes that overflow)
    if (smallest.train.micro_batch == 0) smallest.train.micro_batch = 1;
    estimate_training_memory(smallest, vocab, MemoryLayout{});
  } catch (const SizeOverflow& e) {
    fail(std::string("the sizes this config asks for overflow 64-bit arithmetic (") + e.what() + "): " +
         show("train.micro_batch", c.train.micro_batch, origins) + ", " + show("train.seq_len", c.train.seq_len, origins) +
         ", " + show("model.n_layer", c.model.n_layer, origins) + ", " + show("model.n_embd", c.model.n_embd, origins) +
         ", " + show("model.vocab_size", c.model.vocab_size, origins) + "; lower them");
  } catch (const Error&) {
    // The pipeline estimate walks the schedule, which the generator refuses for micro-batches per
    // step it cannot run (counted here at dp = 1): check_pipeline refuses that, naming the keys,
    // once dp is known.
    if (c.parallel.pp == 1) throw;
  }
}

// The product of the parallel degrees, in floating point (it cannot overflow there) before any
// integer arithmetic multiplies them.
void check_grid_size(const Config& c) {
  const ParallelConfig& p = c.parallel;
  const double ranks = static_cast<double>(p.tp) * static_cast<double>(p.pp) * static_cast<double>(p.cp) *
                       static_cast<double>(p.dp > 0 ? p.dp : 1);
  if (ranks > kMaxRanks) {
    fail("parallel.tp x parallel.pp x parallel.cp" + std::string(p.dp > 0 ? " x parallel.dp" : "") + " = " +
         std::to_string(p.tp) + " x " + std::to_string(p.pp) + " x " + std::to_string(p.cp) +
         (p.dp > 0 ? " x " + std::to_string(p.dp) : "") + " is more than " + format_bound(kMaxRanks) +
         " ranks; lower the parallel degrees");
  }
}

// The pipeline keys (config.h validate_pipeline); origins, when known, say where values came from.
void check_pipeline(const Config& c, int64_t dp_size, const Origins* origins) {
  const ParallelConfig& p = c.parallel;
  const std::string pp = show("parallel.pp", p.pp, origins), vpp = show("parallel.vpp", p.vpp, origins),
                    schedule = show("parallel.pp_schedule", p.pp_schedule, origins),
                    layers = show("parallel.pp_layers", p.pp_layers, origins),
                    n_layer = show("model.n_layer", c.model.n_layer, origins);
  if (p.vpp > 1 && p.pp == 1) fail(vpp + " needs parallel.pp > 1: virtual chunks interleave the stages of a pipeline");
  if (p.pp > 1 && p.vpp > 1 && p.pp_schedule != "interleaved")
    fail(vpp + " needs parallel.pp_schedule = \"interleaved\", not " + schedule +
         ": the other schedules run one chunk of layers per rank");
  if (p.pp > 1 && p.vpp == 1 && p.pp_schedule == "interleaved")
    fail(schedule + " needs parallel.vpp >= 2 chunks per rank, not " + vpp + " (with one chunk per rank it is 1f1b)");
  // Both at most 2^24 (kMaxRanks, kMaxLayers): the product fits.
  const int64_t chunks = p.pp * p.vpp;
  if (chunks > c.model.n_layer)
    fail("parallel.pp x parallel.vpp = " + std::to_string(p.pp) + " x " + std::to_string(p.vpp) + " = " +
         std::to_string(chunks) + " model chunks need at least one block each, but " + n_layer +
         " has fewer; lower parallel.pp or parallel.vpp");
  if (!p.pp_layers.empty()) {
    if (static_cast<int64_t>(p.pp_layers.size()) != p.pp)
      fail(layers + " has " + std::to_string(p.pp_layers.size()) + " entries, but " + pp +
           ": give one block count per stage, or [] for the automatic cut");
    int64_t sum = 0;  // at most 2^24 entries of at most 2^16
    for (int64_t n : p.pp_layers) sum += n;
    if (sum != c.model.n_layer)
      fail(layers + " sums to " + std::to_string(sum) + " blocks, but " + n_layer + ": every block goes to one stage");
    for (size_t i = 0; i < p.pp_layers.size(); ++i) {
      if (p.pp_layers[i] != 0) continue;
      if (i > 0 || !c.model.is_vlm())
        fail(layers + ": stage " + std::to_string(i) + " holds 0 blocks; every stage needs at least one" +
             (c.model.is_vlm() ? " but the first (a vision-language model's stage 0 may hold the vision encoder alone)"
                               : " (only a vision-language model's stage 0, model.kind = \"vlm\", may hold none)"));
      if (p.vpp > 1)
        fail(layers + ": stage 0 holds 0 blocks (the vision encoder's own stage), which needs parallel.vpp = 1, not " +
             vpp + ": its virtual chunks would hold no block");
    }
    for (size_t i = 0; i < p.pp_layers.size(); ++i)
      if (p.pp_layers[i] % p.vpp != 0)
        fail(layers + ": stage " + std::to_string(i) + " holds " + std::to_string(p.pp_layers[i]) +
             " blocks, not a multiple of " + vpp + " (each stage's blocks are split into vpp equal chunks)");
  }
  // parallel.pp_cut = "measured" (app/pp_cut.h) writes its cut into pp_layers at start.
  if (p.pp_cut == "measured" && !p.pp_layers.empty())
    fail(show("parallel.pp_cut", p.pp_cut, origins) + " measures the cut at start, but " + layers +
         " gives one by hand: set one of them (parallel.pp_layers = [] or parallel.pp_cut = \"flops\")");
  // With vpp > 1 it gives each stage vpp equal chunks, as pp_layers does (model/stage_cut_measured.h).
  if (p.pp_cut == "measured" && p.pp > 1 && c.model.n_layer % p.vpp != 0)
    fail(show("parallel.pp_cut", p.pp_cut, origins) + " gives each stage " + vpp + " equal chunks (as " +
         "parallel.pp_layers does), but " + n_layer + " is not a multiple of it; use parallel.pp_cut = \"flops\"");
  // With train.micro_batch = 0 the count is known once the micro-batch is chosen: checked again then.
  if (dp_size > 0 && p.pp > 1 && p.pp_schedule != "gpipe" && c.train.micro_batch > 0) {
    const int64_t m = grad_accum_steps(c, dp_size);
    // The schedule generator's rules (parallel/pipeline_schedule.h check_pipeline_schedule), here
    // with the keys and where their values came from.
    if (p.pp_schedule == "interleaved" && m % p.pp != 0)
      fail("train.global_batch / (train.micro_batch x dp) = " + std::to_string(c.train.global_batch) + " / (" +
           std::to_string(c.train.micro_batch) + " x " + std::to_string(dp_size) + ") = " + std::to_string(m) +
           " micro-batches per step, not a multiple of " + pp + ": " + schedule +
           " runs the micro-batches in groups of pp per chunk; change train.global_batch or train.micro_batch");
    if (m < p.pp)
      fail("train.global_batch / (train.micro_batch x dp) = " + std::to_string(c.train.global_batch) + " / (" +
           std::to_string(c.train.micro_batch) + " x " + std::to_string(dp_size) + ") = " + std::to_string(m) +
           " micro-batches per step, fewer than " + pp + ": " + schedule +
           " needs at least one micro-batch per stage in flight; raise train.global_batch, lower "
           "train.micro_batch, or use parallel.pp_schedule = \"gpipe\"");
  }
}

// parallel.cp_mode = "dynamic" (app/dynamic_cp.h) against what it composes with: packed documents
// (data.batching = "tokens"), a cp group to plan over, the ring (subgroups run point-to-point only),
// one pipeline stage (a pass's rows differ per cp rank: the pipeline's schedule is not built for
// that; a tp group shares its cp rank's plan, so tensor parallelism composes), an explicit layout.
void check_dynamic_cp(const Config& c, const Origins* origins) {
  const ParallelConfig& p = c.parallel;
  if (p.cp_mode != "dynamic") {
    if (!p.cp_calibration.empty())
      fail(show("parallel.cp_calibration", p.cp_calibration, origins) + " is dynamic cp's cost model, but " +
           show("parallel.cp_mode", p.cp_mode, origins) + ": set parallel.cp_mode = \"dynamic\" or remove it");
    return;
  }
  const std::string mode = show("parallel.cp_mode", p.cp_mode, origins);
  if (c.data.batching != "tokens")
    fail(mode + " plans whole documents per row, but " + show("data.batching", c.data.batching, origins) +
         ": use data.batching = \"tokens\"");
  if (p.layout == "auto")
    fail(mode + " needs the cp degree given, but " + show("parallel.layout", p.layout, origins) +
         " plans it: use parallel.layout = \"explicit\"");
  if (p.cp < 2)
    fail(mode + " chooses per row among the cp ranks, but " + show("parallel.cp", p.cp, origins) +
         ": set parallel.cp >= 2 or parallel.cp_mode = \"static\"");
  if (p.cp_comm != "ring")
    fail(mode + " runs split rows' rings over subgroups, point to point, but " +
         show("parallel.cp_comm", p.cp_comm, origins) + " all-gathers over the whole cp group: use "
         "parallel.cp_comm = \"ring\"");
  if (p.pp > 1)
    fail(mode + " gives each cp rank its own passes, which the pipeline schedules are not built for: " +
         show("parallel.pp", p.pp, origins) + "; use parallel.pp = 1");
}

void validate(const Config& c, const Origins* origins) {
  Config copy = c;
  RangeChecker ranges;
  copy.visit(ranges);
  validate_lora(c.lora, c.model.preset);  // model/lora_config.h: the targets against the preset's layers
  if (c.lora.enabled() && c.lora.dropout > 0 && c.train.device == "cuda")  // kernels/dropout.h: CPU only
    fail(show("lora.dropout", c.lora.dropout, origins) + " with train.device = \"cuda\": adapter dropout has no CUDA "
         "kernel yet (kernels/dropout.h); set lora.dropout = 0 or train on the CPU");
  if (c.lora.checkpoint == "adapters" && (!c.lora.enabled() || c.checkpoint.init_from.empty()))
    fail(show("lora.checkpoint", c.lora.checkpoint, origins) + " needs a LoRA run (lora.rank >= 1) whose base is a "
         "file (checkpoint.init_from): an adapters-only checkpoint reads its base tensors from there, and a base "
         "drawn from train.seed is in no file");
  check_grid_size(c);
  if (c.lora.enabled() && c.lora.dropout > 0 && c.data.batching == "tokens")  // app/lora.h's sample index
    fail(show("lora.dropout", c.lora.dropout, origins) + " with data.batching = \"tokens\": the adapter dropout mask "
         "is keyed by a window's index in the global batch, which packed rows (dealt to dp ranks by load) do not "
         "have yet; set lora.dropout = 0 or data.batching = \"windows\"");
  if (c.lora.enabled() && c.lora.dropout > 0 && c.parallel.tp_overlap_chunks > 1)  // model/gpt.cpp's overlapped edges
    fail(show("lora.dropout", c.lora.dropout, origins) + " with parallel.tp_overlap_chunks = " +
         std::to_string(c.parallel.tp_overlap_chunks) + ": the chunked tensor-parallel edges do not apply adapter "
         "dropout yet; set lora.dropout = 0 or parallel.tp_overlap_chunks = 1");
  const auto compressed = [](const std::string& m) { return !m.empty() && m != "none"; };
  if (c.parallel.tp_overlap_chunks > 1 &&
      (compressed(c.parallel.tp_comm_compression) || compressed(c.parallel.tp_comm_compression_forward) ||
       compressed(c.parallel.tp_comm_compression_backward)))  // parallel/tp_overlap.h
    fail("parallel.tp_comm_compression (or its _forward / _backward) with " +
         show("parallel.tp_overlap_chunks", c.parallel.tp_overlap_chunks, origins) + ": the chunked edges move exact "
         "collectives; compression and overlap do not combine yet: choose one");
  if (c.parallel.layout == "explicit")  // parallel/tp_overlap.h
    check_tp_overlap(c.parallel.tp_overlap_chunks, c.parallel.tp, c.parallel.sequence_parallel,
                     c.train.seq_len / std::max<int64_t>(c.parallel.cp, 1));
  if (c.optim.min_lr > c.optim.lr) {
    fail(show("optim.min_lr", c.optim.min_lr, origins) + " must be <= " + show("optim.lr", c.optim.lr, origins));
  }
  if (c.train.micro_batch > 0 && c.train.global_batch % c.train.micro_batch != 0) {
    fail(show("train.global_batch", c.train.global_batch, origins) + " must be a multiple of " +
         show("train.micro_batch", c.train.micro_batch, origins));
  }
  if (c.parallel.dp > 0 && c.train.micro_batch > 0) grad_accum_steps(c, c.parallel.dp);
  if (c.parallel.dp > 0 && c.train.micro_batch == 0) auto_micro_batch(c.train.global_batch, c.parallel.dp, {});
  if (c.model.max_seq_len > 0 && c.train.seq_len > c.model.max_seq_len) {
    fail(show("train.seq_len", c.train.seq_len, origins) + " must be <= " +
         show("model.max_seq_len", c.model.max_seq_len, origins));
  }
  if (c.checkpoint.resume.empty()) {
    fail(show("checkpoint.resume", c.checkpoint.resume, origins) + " is empty: use \"auto\", \"none\" or a path");
  }
  if (!c.checkpoint.init_prefixes.empty() && c.checkpoint.init_from.empty()) {
    fail(show("checkpoint.init_prefixes", c.checkpoint.init_prefixes, origins) +
         " selects tensors of checkpoint.init_from, which is not set: set checkpoint.init_from = \"FILE.h5\"");
  }
  if (!c.checkpoint.init_from.empty() && c.checkpoint.resume != "auto" && c.checkpoint.resume != "none") {
    fail(show("checkpoint.init_from", c.checkpoint.init_from, origins) + " starts a fresh run, but " +
         show("checkpoint.resume", c.checkpoint.resume, origins) + " resumes that file's run: set one of them");
  }
  for (const std::string& p : c.checkpoint.init_prefixes)
    if (p.empty())
      fail(show("checkpoint.init_prefixes", c.checkpoint.init_prefixes, origins) + " holds an empty prefix (it would "
           "match every tensor): use [] for all of them");
  if (c.model.recompute_layers > c.model.n_layer) {
    fail(show("model.recompute_layers", c.model.recompute_layers, origins) + " blocks per chunk recompute fully, but " +
         show("model.n_layer", c.model.n_layer, origins) + " has fewer; use at most model.n_layer");
  }
  if (c.model.recompute_ahead != 1 && c.model.recompute != "bubble") {
    fail(show("model.recompute_ahead", c.model.recompute_ahead, origins) + " places the R actions of " +
         "model.recompute = \"bubble\", but " + show("model.recompute", c.model.recompute, origins) +
         " has none: set model.recompute = \"bubble\" or leave model.recompute_ahead at 1");
  }
  check_token_batching(c);  // data.batching = "tokens" (app/token_batching.h)
  check_dynamic_cp(c, origins);  // parallel.cp_mode = "dynamic" (app/dynamic_cp.h)
  activation_compression_policy(c);  // model.activation_compression*: the names, the rank, recompute, device
  recompute_ops_policy(c);           // model.recompute_ops*: the names, and what they do not combine with
  if (c.data.document_mask && c.data.task != "tokens") {
    fail(show("data.document_mask", c.data.document_mask, origins) + " needs documents, but " +
         show("data.task", c.data.task, origins) + " has none (its windows hold no end-of-text id): use data.task "
         "= \"tokens\" or data.document_mask = false");
  }
  if (c.parallel.comm == "nccl" && c.train.device != "cuda") {
    fail(show("parallel.comm", c.parallel.comm, origins) + " moves device tensors (NCCL), but " +
         show("train.device", c.train.device, origins) + " keeps them in host memory: set train.device = \"cuda\" "
         "or parallel.comm = \"mpi\"");
  }
  if (c.data.document_mask && c.train.device != "cpu") {
    fail(show("data.document_mask", c.data.document_mask, origins) + " runs on the CPU only (the CUDA attention "
         "kernel has no document mask), but " + show("train.device", c.train.device, origins));
  }
  if (!c.upscale.method.empty() && (c.upscale.at_step < 1 || c.upscale.at_step >= c.train.steps)) {
    fail(show("upscale.at_step", c.upscale.at_step, origins) + " must be in [1, train.steps - 1] for " +
         show("upscale.method", c.upscale.method, origins) + " (" + show("train.steps", c.train.steps, origins) + ")");
  }
  if (c.upscale.align_data > 0 && c.upscale.method != "ot") {
    fail(show("upscale.align_data", c.upscale.align_data, origins) + " aligns the units of neighbouring layers by " +
         "their activations, which only upscale.method = \"ot\" does, but " +
         show("upscale.method", c.upscale.method, origins) + ": set upscale.align_data = 0 or upscale.method = \"ot\"");
  }
  if (c.upscale.method.empty() && (c.upscale.tp > 0 || c.upscale.pp > 0 || c.upscale.dp > 0)) {
    fail(show("upscale.tp", c.upscale.tp, origins) + ", " + show("upscale.pp", c.upscale.pp, origins) + ", " +
         show("upscale.dp", c.upscale.dp, origins) + ": the layout after a growth needs upscale.method (which "
         "method grows the model)");
  }
  if (c.upscale.method.empty() && c.upscale.at_step != 0) {
    fail(show("upscale.at_step", c.upscale.at_step, origins) + " needs upscale.method (which method grows the model)");
  }
  if (origins)  // parallel.layout = "auto" plans the layout keys: refused when set too (app/auto_layout.h)
    check_auto_layout_keys(c, [origins](const std::string& key) -> std::optional<std::string> {
      const auto it = origins->find(key);
      return it == origins->end() ? std::nullopt : std::optional<std::string>(it->second);
    });
  check_tp_compression(resolve_tp_compression(c.parallel.tp_comm_compression, c.parallel.tp_comm_compression_forward,
                                              c.parallel.tp_comm_compression_backward),
                       c.train.device);
  check_model(c);
  check_pipeline(c, c.parallel.dp > 0 ? c.parallel.dp : 0, origins);
  check_sizes(c, origins);
}

Config parse_with_overrides(const std::string& text, const std::string& source,
                            const std::vector<std::string>& overrides) {
  Config c;
  Origins origins;
  apply_file(c, parse_toml(text, source), source, origins);
  for (const auto& arg : overrides) apply_override(c, arg, origins);
  validate(c, &origins);
  return c;
}

// ---- Rendering -----------------------------------------------------------------------------

std::string comment(const FieldInfo& f) {
  std::string allowed = f.allowed.describe();
  return "# " + f.doc + (allowed.empty() ? "" : " (" + allowed + ")") + "\n";
}

// Text safe inside a Markdown table cell: '|' would end the cell, '<' could open an HTML tag.
std::string table_cell(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += "\\|";
    else if (ch == '<') out += "&lt;";
    else out += ch;
  }
  return out;
}

}  // namespace

// ---- Public API ----------------------------------------------------------------------------

Config parse_config_string(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  return parse_with_overrides(toml_text, source_name, overrides);
}

namespace {
// A config is a small regular file: a directory would read as empty (the default model would
// train), /dev/urandom or a FIFO would never end. Checked before the first byte is read.
void check_config_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);  // follows symlinks
  if (ec || !std::filesystem::exists(st)) return;      // the open below names the problem
  if (std::filesystem::is_directory(st))
    fail("the config file " + path + " is a directory; give a TOML file, e.g. configs/quickstart.toml");
  if (!std::filesystem::is_regular_file(st))
    fail("the config file " + path + " is not a regular file (a device, FIFO or socket); give a TOML file");
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > static_cast<uintmax_t>(kMaxConfigBytes))
    fail("the config file " + path + " has " + std::to_string(size) + " bytes, more than a config can (" +
         std::to_string(kMaxConfigBytes) + "): is it the right file?");
}
}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  check_config_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open config file " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  Config c = parse_with_overrides(text.str(), path, overrides);
  if (c.train.name.empty()) c.train.name = std::filesystem::path(path).stem().string();
  return c;
}

void validate(const Config& c) { validate(c, nullptr); }

std::string to_toml(const Config& c) {
  std::string out =
      "# tessera configuration, fully resolved: every section and key (docs/config.md).\n";
  for (const auto& s : catalog(c)) {
    out += "\n# " + s.doc + "\n[" + s.name + "]\n";
    for (const auto& f : s.fields) out += comment(f) + f.key + " = " + f.value + "\n";
  }
  return out;
}

std::vector<ConfigChange> config_changes(const Config& before, const Config& after) {
  std::vector<ConfigChange> out;
  const auto a = catalog(before), b = catalog(after);
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].fields.size(); ++j)
      if (a[i].fields[j].value != b[i].fields[j].value)
        out.push_back({a[i].name + "." + a[i].fields[j].key, a[i].fields[j].value, b[i].fields[j].value});
  return out;
}

std::string config_reference_markdown() {
  std::string out;
  for (const auto& s : catalog(Config{})) {
    std::string doc = s.doc;
    doc[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(doc[0])));
    out += "### [" + s.name + "]\n\n" + doc + ".\n\n";
    out += "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
    for (const auto& f : s.fields) {
      std::string allowed = f.allowed.describe();
      out += "| `" + f.key + "` | " + f.type + " | `" + f.value + "` | " +
             table_cell(allowed.empty() ? "any" : allowed) + " | " + table_cell(f.doc) + " |\n";
    }
    out += "\n";
  }
  return out;
}

int64_t grad_accum_steps(const Config& c, int64_t dp_size) {
  const int64_t gb = c.train.global_batch, mb = c.train.micro_batch;
  if (dp_size < 1) fail("the data-parallel size must be >= 1, got " + std::to_string(dp_size));
  if (mb < 1) fail("internal: train.micro_batch = 0 (automatic) was not resolved (auto_micro_batch) before use");
  if (gb % (mb * dp_size) != 0) {
    fail("train.global_batch = " + std::to_string(gb) + " must be a multiple of train.micro_batch x dp = " +
         std::to_string(mb) + " x " + std::to_string(dp_size) + " = " + std::to_string(mb * dp_size) +
         ": each optimizer step needs a whole number of micro-batches per data-parallel rank");
  }
  return gb / (mb * dp_size);
}

int64_t auto_micro_batch(int64_t global_batch, int64_t dp_size, const std::function<bool(int64_t)>& fits) {
  if (dp_size < 1) fail("the data-parallel size must be >= 1, got " + std::to_string(dp_size));
  if (global_batch % dp_size != 0) {
    fail("train.global_batch = " + std::to_string(global_batch) + " must be a multiple of the data-parallel degree " +
         "dp = " + std::to_string(dp_size) + ": every rank runs the same number of sequences per step " +
         "(train.micro_batch = 0 picks the largest micro-batch that divides global_batch / dp)");
  }
  const int64_t per_rank = global_batch / dp_size;
  std::vector<int64_t> divisors;  // ascending: small ones, then their partners
  for (int64_t d = 1; d * d <= per_rank; ++d)
    if (per_rank % d == 0) divisors.push_back(d);
  for (size_t i = divisors.size(); i-- > 0;)
    if (divisors[i] * divisors[i] != per_rank) divisors.push_back(per_rank / divisors[i]);
  for (size_t i = divisors.size(); i-- > 0;)
    if (!fits || fits(divisors[i])) return divisors[i];
  return 1;
}

GridDegrees grid_degrees(const ParallelConfig& p) {
  return GridDegrees{p.tp, p.cp, p.pp, p.dp};
}

void validate_pipeline(const Config& c, int64_t dp_size) { check_pipeline(c, dp_size, nullptr); }

ModelConfig to_model_config(const Config& c, int64_t data_vocab_size) {
  const ModelSection& s = c.model;
  if (s.vocab_size == 0 && data_vocab_size <= 0) {
    fail("model.vocab_size = 0 takes the vocabulary size from the data, but the data gave none");
  }
  if (s.vocab_size > 0 && data_vocab_size > s.vocab_size) {
    fail("model.vocab_size = " + std::to_string(s.vocab_size) + " is smaller than the data's vocabulary (" +
         std::to_string(data_vocab_size) + " tokens)");
  }
  ModelConfig m = s;  // the architecture fields; recompute is the trainer's
  m.vision = c.vision;
  m.lora = c.lora;
  m.vocab_size = s.vocab_size > 0 ? s.vocab_size : data_vocab_size;
  m.max_seq_len = s.max_seq_len > 0 ? s.max_seq_len : c.train.seq_len;
  return resolve(m);
}

Recompute recompute_kind(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full" || name == "bubble") return Recompute::Full;  // bubble: Full, recomputed by the schedule's R
  fail("model.recompute = \"" + name + "\" is not a policy; expected \"none\", \"selective\", \"full\" or \"bubble\"");
}

bool recompute_in_bubbles(const Config& c) { return c.model.recompute == "bubble" && c.parallel.pp > 1; }

std::vector<Recompute> recompute_policy(const Config& c, const std::vector<StageSpec>& chunks) {
  const int64_t L = c.model.n_layer;
  TESSERA_CHECK(c.model.recompute_layers >= 0 && c.model.recompute_layers <= L, "model.recompute_layers = ",
                c.model.recompute_layers, " must be in [0, model.n_layer = ", L, "]");
  std::vector<Recompute> policy(static_cast<size_t>(L), recompute_kind(c.model.recompute));
  const std::vector<StageSpec> whole = {StageSpec{0, L, true, true}};
  for (const StageSpec& chunk : chunks.empty() ? whole : chunks) {
    const int64_t last = chunk.end_layer < 0 ? L : chunk.end_layer;  // -1: the model's end
    const int64_t end = std::min(last, chunk.first_layer + c.model.recompute_layers);
    for (int64_t l = chunk.first_layer; l < end; ++l) policy[static_cast<size_t>(l)] = Recompute::Full;
  }
  return policy;
}

std::vector<Recompute> recompute_policy(const Config& c) { return recompute_policy(c, {}); }

std::vector<ActivationCompression> activation_compression_policy(const Config& c) {
  const ModelSection& m = c.model;
  auto policy = compression_policy(m.activation_compression, m.activation_compression_layers,
                                   m.activation_compression_rank, m.n_layer);
  if (any_compression(policy) && c.train.device == "cuda")
    fail("model.activation_compression is not built for train.device = \"cuda\": use \"none\" there");
  check_compression_policy(policy, recompute_policy(c));
  return policy;
}

std::vector<RecomputeOps> recompute_ops_policy(const Config& c, const std::vector<StageSpec>& chunks) {
  const ModelSection& m = c.model;
  std::vector<RecomputeOps> ops = recompute_ops_policy(m.recompute_ops, m.recompute_ops_layers, m.n_layer);
  const RecomputeOps any = united(ops);  // for the checks below
  if (!any.any()) return ops;
  const std::string keys = m.recompute_ops_layers.empty() ? "model.recompute_ops" : "model.recompute_ops_layers";
  const std::string what = keys + " (" + recompute_ops_name(any) + ")";
  if (m.recompute != "none")
    fail(what + " chooses what blocks that keep their context recompute, but model.recompute = \"" + m.recompute +
         "\" already recomputes every block: set model.recompute = \"none\" (model.recompute_layers may still make "
         "the first blocks of each chunk recompute fully)");
  if (c.parallel.layout == "auto")
    fail(what + " with parallel.layout = \"auto\": the planner chooses model.recompute, not the ops; set the "
         "layout explicitly or model.recompute_ops = []");
  const std::vector<ActivationCompression> compression = activation_compression_policy(c);
  for (size_t l = 0; l < ops.size(); ++l)
    if (ops[l].any() && compression[l].active())
      fail(keys + " recomputes \"" + recompute_ops_name(ops[l]) + "\" on layer " + std::to_string(l) +
           ", which model.activation_compression compresses (\"" + compression_name(compression[l].method) +
           "\"): a block either recomputes or compresses its inputs; choose one per layer");
  const bool gemms = any.qkv || any.mlp_in;  // the region re-entered and the column-parallel GEMMs again
  // With parallel.tp_overlap_chunks > 1 qkv and mlp_in re-gather chunk by chunk: the forward's GEMMs again.
  if (any.reruns_gemms() && c.parallel.cp > 1)
    fail(what + " with parallel.cp = " + std::to_string(c.parallel.cp) + ": qkv, attn and mlp_in are not built for "
         "context parallelism (the ring attention's recomputation is not counted in the memory estimate); use norm, "
         "mlp_act or parallel.cp = 1");
  const TpCompressionModes tp_modes = resolve_tp_compression(
      c.parallel.tp_comm_compression, c.parallel.tp_comm_compression_forward, c.parallel.tp_comm_compression_backward);
  if (gemms && tp_modes.forward == TpCompressionMode::Int8Ef)
    fail(what + " with parallel.tp_comm_compression_forward = \"int8-ef\": the re-entered region's all-gather "
         "would quantize with another residual than the forward's; use the ops norm, attn, mlp_act or forward "
         "\"int8\"");
  if (gemms && c.lora.enabled())
    fail(what + " with lora.rank = " + std::to_string(c.lora.rank) + ": the memory estimate does not count the "
         "adapters' temporaries in a recomputed GEMM; use norm, attn, mlp_act or no adapters");
  const std::vector<Recompute> recompute = recompute_policy(c, chunks);
  for (size_t l = 0; l < ops.size(); ++l)
    if (recompute[l] != Recompute::None) ops[l] = {};  // model.recompute_layers: these recompute fully
  return ops;
}

std::vector<RecomputeOps> recompute_ops_policy(const Config& c) { return recompute_ops_policy(c, {}); }

std::string run_dir(const Config& c) { return (std::filesystem::path(c.log.dir) / c.train.name).string(); }

std::string checkpoint_dir(const Config& c, const std::string& dir) {
  if (!c.checkpoint.dir.empty()) return c.checkpoint.dir;
  return dir.empty() ? "" : (std::filesystem::path(dir) / "checkpoints").string();
}

}  // namespace tessera
