// `shardlm import-accelerate CONFIG.yaml [--training-args ARGS.json] -o DECK [--section.key=value ...]`:
// writes a deck from an Accelerate FSDP config and TrainingArguments. Reads files only: no MPI.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "accelerate_import.hpp"
#include "commands.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

int command_import_accelerate(const std::vector<std::string>& args) {
  std::string yaml_path, args_path, out_path;
  std::vector<std::string> deck_keys;
  bool tables = false;
  std::string command_line = "shardlm import-accelerate";
  const auto usage = [](const std::string& problem) {
    std::fprintf(stderr, "shardlm: import-accelerate: %s\n\n%s", problem.c_str(),
                 command_help("import-accelerate").c_str());
    return 2;
  };
  try {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (option_value(args, i, "--training-args", args_path) || option_value(args, i, "-o", out_path) ||
          option_value(args, i, "--output", out_path) || deck_key_argument(args, i, deck_keys))
        continue;
      if (a == "--key-tables")
        tables = true;
      else if (a.rfind("-", 0) == 0 || !yaml_path.empty())
        return usage(concat("unexpected argument '", a, "'"));
      else
        yaml_path = a;
    }
  } catch (const Error& e) {  // a deck key without its value
    return usage(e.what());
  }
  if (tables) {
    std::fputs(foreign_key_tables().c_str(), stdout);
    return 0;
  }
  if (yaml_path.empty() || out_path.empty())
    return usage(yaml_path.empty() ? "the Accelerate config file is missing" : "-o DECK is missing");
  for (const std::string& a : args) command_line += " " + a;
#ifndef SHARDLM_HAVE_YAMLCPP
  std::fprintf(stderr, "shardlm: error: this shardlm was built without yaml-cpp, which import-accelerate reads "
                       "Accelerate's YAML with: install it (Debian: libyaml-cpp-dev) and configure again\n");
  return 1;
#else
  try {
    const std::string yaml = read_input_file(yaml_path, "Accelerate config", kMaxDeckBytes);
    const std::string json = args_path.empty() ? "" : read_input_file(args_path, "TrainingArguments", kMaxDeckBytes);
    if (!args_path.empty() && json.find_first_not_of(" \t\r\n") == std::string::npos)
      throw Error(concat(args_path, ": empty file (expected a JSON object of TrainingArguments)"));
    const AccelerateImport imported = import_accelerate(yaml, yaml_path, json, args_path, deck_keys, command_line);
    {
      // Written under a temporary name and renamed: a failed write leaves no half deck.
      const std::string tmp = out_path + ".tmp";
      std::ofstream out(tmp, std::ios::binary);
      SHARDLM_CHECK(out, "import-accelerate: cannot write '", out_path, "'");
      out << imported.deck;
      out.close();
      SHARDLM_CHECK(out, "import-accelerate: writing '", out_path, "' failed");
      std::error_code ec;
      std::filesystem::rename(tmp, out_path, ec);
      SHARDLM_CHECK(!ec, "import-accelerate: cannot rename '", tmp, "' to '", out_path, "': ", ec.message());
    }
    for (const std::string& w : imported.warnings) std::fprintf(stderr, "shardlm: warning: %s\n", w.c_str());
    std::printf("wrote %s (%zu warning%s); run it on %d rank%s: mpirun -np %d shardlm train %s\n", out_path.c_str(),
                imported.warnings.size(), imported.warnings.size() == 1 ? "" : "s", imported.ranks,
                imported.ranks == 1 ? "" : "s", imported.ranks, out_path.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    return 1;
  }
  return 0;
#endif
}

}  // namespace shardlm
