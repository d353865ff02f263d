// What the commands' flags share: `--flag VALUE` / `--flag=VALUE`, DECK-first argument lists, and sizes
// such as 80GiB.
#include <cctype>
#include <cmath>
#include <stdexcept>

#include "commands.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

bool option_value(const std::vector<std::string>& args, size_t& i, const std::string& flag, std::string& out) {
  const std::string& a = args[i];
  if (a == flag) {
    if (i + 1 >= args.size()) return false;
    out = args[++i];
    return true;
  }
  if (a.rfind(flag + "=", 0) == 0) {
    out = a.substr(flag.size() + 1);
    return true;
  }
  return false;
}

bool deck_key_argument(const std::vector<std::string>& args, size_t& i, std::vector<std::string>& overrides) {
  const std::string& a = args[i];
  const size_t dot = a.find('.'), eq = a.find('=');
  if (a.rfind("--", 0) != 0 || dot == std::string::npos || dot > eq) return false;
  if (eq != std::string::npos) {
    overrides.push_back(a);
    return true;
  }
  // The deck's parser says the same of a key without its value.
  const std::string key = a.substr(2);
  SHARDLM_CHECK(i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0, key,
                " needs a value on the command line (write --", key, "=VALUE)");
  overrides.push_back(a + "=" + args[++i]);
  return true;
}

void take_deck_override(const std::vector<std::string>& args, size_t& i, std::vector<std::string>& overrides) {
  if (deck_key_argument(args, i, overrides)) return;
  if (args[i].rfind("--", 0) == 0)
    throw Error(concat("unknown option '", args[i], "' (deck keys look like --section.key=value)"));
  overrides.push_back(args[i]);
}

bool DeckArgument::value(const std::string& flag, std::string& out) {
  SHARDLM_CHECK(arg() != flag || i + 1 < args.size(), flag, " needs a value");
  return option_value(args, i, flag, out);
}

std::string parse_deck_arguments(const std::vector<std::string>& args, std::vector<std::string>& overrides,
                                 const std::function<bool(DeckArgument&)>& option) {
  SHARDLM_CHECK(!args.empty() && args[0].rfind("--", 0) != 0, "the first argument must be the deck");
  for (size_t i = 1; i < args.size(); ++i) {
    DeckArgument a{args, i};
    if (!option(a)) take_deck_override(args, i, overrides);
  }
  return args[0];
}

// "80GiB", "40 GB", "16000MiB", "1.5TiB": a unit is required (is a bare 80 bytes or GiB?).
size_t parse_size(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double value = 0;
  // A decimal number only: std::stod alone would also read hexadecimal ("0x10GiB"), "inf" and "nan".
  const std::string number = text.substr(0, text.find_first_not_of("0123456789.eE+-"));
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0) throw Error(concat(flag, " = '", text, "': not a size (write e.g. 80GiB or 40GB)"));
  std::string unit = text.substr(used);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {{"b", 1},      {"kb", 1e3},      {"mb", 1e6},
                                                  {"gb", 1e9},   {"tb", 1e12},     {"kib", 1024.0},
                                                  {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& u : units)
    if (unit == u.first) {
      SHARDLM_CHECK(std::isfinite(value) && value > 0, flag, " = '", text, "': must be positive");
      const double bytes = value * u.second;
      // (A size_t holds up to 16 EiB; the cast of anything larger is undefined.)
      SHARDLM_CHECK(bytes >= 1 && bytes < 1.8e19, flag, " = '", text, "': ",
                    bytes < 1 ? "less than one byte" : "more bytes than a size can hold");
      return static_cast<size_t>(bytes);
    }
  throw Error(concat(flag, " = '", text, "': ", unit.empty() ? "give a unit" : "unknown unit '" + unit + "'",
                     " (B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. 80GiB)"));
}

}  // namespace shardlm
