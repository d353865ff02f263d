// `shardlm deck-reference [--check] FILE`: docs/deck.md's tables of keys written anew from the keys'
// declarations (src/config/keys_*.cpp), or, with --check, a failure when FILE's tables are stale (CTest's
// deck_reference). Only reads and writes a file: no MPI.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.hpp"
#include "shardlm/config.hpp"

namespace shardlm {

int command_deck_reference(const std::vector<std::string>& args) {
  const bool check = !args.empty() && args[0] == "--check";
  if (args.size() != (check ? 2u : 1u) || args.back().rfind("--", 0) == 0) {
    std::fputs(usage_error("deck-reference", "expected FILE or --check FILE").c_str(), stderr);
    return 2;
  }
  const std::string& path = args.back();
  std::ostringstream text;
  std::ifstream in(path, std::ios::binary);
  text << in.rdbuf();
  if (!in) {
    std::fprintf(stderr, "shardlm: deck-reference: cannot read '%s'\n", path.c_str());
    return 1;
  }
  std::string written;
  try {
    written = deck_reference_tables(text.str());
  } catch (const Error& e) {
    std::fprintf(stderr, "shardlm: deck-reference: %s: %s\n", path.c_str(), e.what());
    return 1;
  }
  if (check) {
    if (written == text.str()) return 0;
    std::fprintf(stderr,
                 "shardlm: deck-reference: the key tables of %s differ from the keys' declarations in "
                 "src/config/keys_*.cpp (edit those, not the tables): run `build/bin/shardlm deck-reference %s` "
                 "and commit the result\n",
                 path.c_str(), path.c_str());
    return 1;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << written;
  if (!out.flush()) {
    std::fprintf(stderr, "shardlm: deck-reference: cannot write '%s'\n", path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace shardlm
