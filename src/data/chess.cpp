// load_chess: chess games as UCI move sequences (JSON lines with a "moves" field, or one game per
// line of text) to next-token examples over "e2e4 e7e5 ...".
#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data_file.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

using nlohmann::json;

std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::vector<std::string> split_on_spaces(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The value of the one member named "moves" in any letter case ("Moves" in
// laion/strategic_game_chess); two spellings of it in one record are ambiguous.
const json& moves_member(const json& record, const std::string& where) {
  const json* found = nullptr;
  for (auto it = record.begin(); it != record.end(); ++it) {
    if (lower_ascii(it.key()) != "moves") continue;
    SHARDLM_CHECK(found == nullptr, where, ": more than one 'moves' field (names are matched in any case)");
    found = &it.value();
  }
  SHARDLM_CHECK(found != nullptr, where, ": missing 'moves' (or 'Moves'): a list of UCI moves");
  return *found;
}

std::vector<std::string> json_moves(const std::string& line, const std::string& where) {
  const json record = parse_json_record(line, where);
  const json& moves = moves_member(record, where);
  if (moves.is_string()) return split_on_spaces(moves.get<std::string>());
  SHARDLM_CHECK(moves.is_array(), where, ": 'moves' must be a list of strings or one space-separated string");
  std::vector<std::string> out;
  for (size_t i = 0; i < moves.size(); ++i) {
    SHARDLM_CHECK(moves[i].is_string(), where, ": moves[", i, "] must be a string, got ", moves[i].dump());
    out.push_back(moves[i].get<std::string>());
  }
  return out;
}

// Moves joined by single spaces, each checked.
std::string game_text(const std::vector<std::string>& moves, const std::string& where) {
  SHARDLM_CHECK(!moves.empty(), where, ": a game with no moves");
  std::string text;
  for (size_t i = 0; i < moves.size(); ++i) {
    SHARDLM_CHECK(is_uci_move(moves[i]), where, ": move ", i + 1, " '", moves[i],
                  "' is not a UCI move (from and to squares such as e2e4, a promotion such as e7e8q)");
    text += (i == 0 ? "" : " ") + moves[i];
  }
  return text;
}

}  // namespace

bool is_uci_move(const std::string& move) {
  if (move.size() != 4 && move.size() != 5) return false;
  const auto file = [](char c) { return c >= 'a' && c <= 'h'; };
  const auto rank = [](char c) { return c >= '1' && c <= '8'; };
  if (!file(move[0]) || !rank(move[1]) || !file(move[2]) || !rank(move[3])) return false;
  if (move[0] == move[2] && move[1] == move[3]) return false;
  if (move.size() == 4) return true;
  if (move[4] != 'q' && move[4] != 'r' && move[4] != 'b' && move[4] != 'n') return false;
  const bool white_promotes = move[1] == '7' && move[3] == '8';
  const bool black_promotes = move[1] == '2' && move[3] == '1';
  return (white_promotes || black_promotes) && std::abs(move[0] - move[2]) <= 1;
}

std::vector<Example> load_chess(const std::string& path, const Tokenizer& tok,
                                const DatasetOptions& opt) {
  SHARDLM_CHECK(opt.max_length >= 2, path, ": max_length must be at least 2, got ", opt.max_length);
  std::vector<Example> examples;
  bool decided = false, json_lines = false;
  for_each_record_line(path, [&](const std::string& line, const std::string& where) {
    if (!decided) {
      // The first record decides the file's kind, so a stray text line in JSONL is an error.
      json_lines = line[line.find_first_not_of(" \t")] == '{';
      decided = true;
    }
    const std::vector<std::string> moves = json_lines ? json_moves(line, where) : split_on_spaces(line);
    examples.push_back(next_token_example(tok.encode(game_text(moves, where)), tok, opt.max_length));
  });
  SHARDLM_CHECK(!examples.empty(), path, ": no games in the file");
  return select_subset(std::move(examples), opt);
}

}  // namespace shardlm
