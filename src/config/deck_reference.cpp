// docs/deck.md's tables of keys, written from the keys' declarations (keys_<section>.cpp) between marker
// comments, so the reference cannot drift from the parser.
#include <sstream>

#include "config_internal.hpp"

namespace shardlm {

using namespace config_detail;

namespace {

std::string begin_marker(const std::string& section) {
  return concat("<!-- the keys of [", section, "]: generated from src/config/keys_*.cpp by `shardlm deck-reference "
                "docs/deck.md`; edit them there -->");
}
std::string end_marker(const std::string& section) { return concat("<!-- end of the keys of [", section, "] -->"); }

// The default column: the declaration's own word, "required", or what the field's initializer gives.
std::string default_text(const KeySpec& k) {
  static const RunConfig defaults{};
  if (!k.default_doc.empty()) return k.default_doc;
  if (k.required) return "required";
  const std::string v = k.get(defaults);
  return v.empty() ? "empty" : concat("`", v, "`");
}

std::string section_table(const DeckSection& s) {
  std::ostringstream os;
  os << "| key | type | default | backend | meaning |\n| --- | --- | --- | --- | --- |\n";
  for (const KeySpec& k : s.keys)
    os << "| `" << k.name.substr(k.name.find('.') + 1) << "` | " << k.type << " | " << default_text(k) << " | "
       << k.backend << " | " << k.help << " |\n";
  return os.str();
}

}  // namespace

std::string deck_reference_tables(const std::string& doc) {
  std::string out = doc;
  for (const DeckSection& s : deck_sections()) {
    const std::string begin = begin_marker(s.name) + "\n", end = end_marker(s.name);
    const size_t b = out.find(begin);
    const size_t e = b == std::string::npos ? b : out.find(end, b);
    SHARDLM_CHECK(b != std::string::npos && e != std::string::npos, "the deck reference has no place for the keys of [",
                  s.name, "]: put the lines\n", begin, end, "\nwhere its table goes");
    out.replace(b + begin.size(), e - b - begin.size(), section_table(s));
  }
  return out;
}

}  // namespace shardlm
