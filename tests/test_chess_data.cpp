#define BOOST_TEST_MODULE test_chess_data
#include <boost/test/unit_test.hpp>

// Tests of the chess reader (UCI move sequences from JSON lines or text) and its data.format.
#include <string>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "test_support.hpp"

using namespace shardlm;

namespace {

const std::string kFixtures = SHARDLM_SOURCE_DIR "/tests/fixtures/data/";

// The text an example trains on: its tokens without BOS and EOS.
std::string text_of(const Example& ex) {
  return ByteTokenizer().decode(ex.tokens);
}

}  // namespace

BOOST_AUTO_TEST_CASE(uci_syntax) {
  for (const char* good : {"e2e4", "g1f3", "e1g1", "e7e8q", "h7g8n", "a2a1r", "b2a1b", "b7a8q", "e2e1q"})
    BOOST_TEST(is_uci_move(good), good);
  for (const char* bad : {"", "e2e", "e2e4e5", "e2-e4", "E2E4", "e2e2", "i2i4", "e0e1", "e9e4", "0000",
                          "e2e4q",   // a promotion away from the last rank
                          "e7e8k",   // no promotion to a king
                          "e7e8Q",   // UCI writes the piece in lower case
                          "e7c8q",   // a pawn takes one file to the side at most
                          "e7e6q",   // promotes going back from the 7th rank
                          "e6e8q"})  // two ranks at once
    BOOST_TEST(!is_uci_move(bad), bad);
}

BOOST_AUTO_TEST_CASE(json_lines_with_any_case_of_moves) {
  const std::vector<Example> games = load_chess(kFixtures + "chess_games.jsonl", ByteTokenizer(), DatasetOptions{});
  BOOST_TEST_REQUIRE(games.size() == 3u);  // the blank line is skipped
  BOOST_TEST(text_of(games[0]) == "e2e4 e7e5 f1c4 b8c6 d1h5 g8f6 h5f7");  // "Moves": a list
  BOOST_TEST(text_of(games[1]) == "f2f3 e7e5 g2g4 d8h4");                 // "moves": one string
  BOOST_TEST(text_of(games[2]) == "a2a4 b7b5 a4b5 a7a6 b5a6 c8b7 a6b7 b8c6 b7a8q");  // "MOVES"
  // [BOS] text [EOS] and a loss on every next token.
  const Example& g = games[1];
  BOOST_TEST(g.tokens.size() == 2 + std::string("f2f3 e7e5 g2g4 d8h4").size());
  BOOST_TEST(g.tokens.front() == ByteTokenizer::kBos);
  BOOST_TEST(g.tokens.back() == ByteTokenizer::kEos);
  for (size_t t = 0; t + 1 < g.tokens.size(); ++t) BOOST_TEST(g.targets[t] == g.tokens[t + 1]);
  BOOST_TEST(g.targets.back() == -1);
}

BOOST_AUTO_TEST_CASE(text_lines_give_the_same_examples) {
  const std::vector<Example> from_json = load_chess(kFixtures + "chess_games.jsonl", ByteTokenizer(), DatasetOptions{});
  const std::vector<Example> from_text = load_chess(kFixtures + "chess_games.txt", ByteTokenizer(), DatasetOptions{});
  BOOST_TEST_REQUIRE(from_text.size() == from_json.size());
  for (size_t i = 0; i < from_text.size(); ++i) {
    BOOST_TEST(from_text[i].tokens == from_json[i].tokens, boost::test_tools::per_element());
    BOOST_TEST(from_text[i].targets == from_json[i].targets, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(truncation_keeps_the_opening) {
  DatasetOptions opt;
  opt.max_length = 10;
  const std::vector<Example> games = load_chess(kFixtures + "chess_games.txt", ByteTokenizer(), opt);
  for (const Example& g : games) {
    BOOST_TEST(g.tokens.size() == 10u);
    BOOST_TEST(g.tokens.front() == ByteTokenizer::kBos);
    BOOST_TEST(g.targets.back() == -1);  // the cut-off token is not predicted
  }
  BOOST_TEST(text_of(games[0]) == "e2e4 e7e5");  // BOS + 9 characters
}

BOOST_AUTO_TEST_CASE(subset_of_games) {
  DatasetOptions opt;
  opt.limit = 2;
  BOOST_TEST(load_chess(kFixtures + "chess_games.txt", ByteTokenizer(), opt).size() == 2u);
  const std::vector<Example> demo =
      load_chess(SHARDLM_SOURCE_DIR "/input/data/demo_chess_train.jsonl", ByteTokenizer(), DatasetOptions{});
  BOOST_TEST(demo.size() == 28u);
}

BOOST_AUTO_TEST_CASE(malformed_games_name_file_line_and_move) {
  const ByteTokenizer tok;
  auto message = [&](const std::string& name) {
    return error_of([&] { load_chess(kFixtures + name, tok, DatasetOptions{}); });
  };
  std::string m = message("chess_bad_move.txt");
  BOOST_TEST(contains(m, "chess_bad_move.txt:2"), m);
  BOOST_TEST(contains(m, "move 3 'e9e4'"), m);
  m = message("chess_move_not_string.jsonl");
  BOOST_TEST(contains(m, "chess_move_not_string.jsonl:2: moves[1] must be a string"), m);
  m = message("chess_text_in_jsonl.jsonl");
  BOOST_TEST(contains(m, "chess_text_in_jsonl.jsonl:2: not valid JSON"), m);
  m = message("chess_two_moves_fields.jsonl");
  BOOST_TEST(contains(m, "chess_two_moves_fields.jsonl:1: more than one 'moves' field"), m);
  m = message("chess_no_moves.jsonl");
  BOOST_TEST(contains(m, "chess_no_moves.jsonl:1: missing 'moves'"), m);
  m = message("chess_empty_game.jsonl");
  BOOST_TEST(contains(m, "chess_empty_game.jsonl:1: a game with no moves"), m);
  m = error_of([&] { load_chess(kFixtures + "no_such_file.txt", tok, DatasetOptions{}); });
  BOOST_TEST(contains(m, "no_such_file.txt"), m);
  m = error_of([&] { load_chess(kFixtures, tok, DatasetOptions{}); });  // a directory
  BOOST_TEST(contains(m, "cannot open data file"), m);
}

BOOST_AUTO_TEST_CASE(deck_format_chess_reads_games) {
  const std::string deck = SHARDLM_SOURCE_DIR "/input/demo.ini";
  const RunConfig cfg = load_run_config(
      deck, {"--data.format=chess", "--data.train_file=" + kFixtures + "chess_games.jsonl", "--data.eval_file="}, 1);
  BOOST_TEST((cfg.data.format == DataFormat::Chess));
  DatasetOptions opt;
  opt.max_length = cfg.data.max_length;
  BOOST_TEST(load_examples(cfg.data.format, cfg.data.train_file, ByteTokenizer(), opt).size() == 3u);
  const std::string m = error_of([&] { load_run_config(deck, {"--data.format=pgn"}, 1); });
  BOOST_TEST(contains(m, "data.format"), m);
  BOOST_TEST(contains(m, "squad, jsonl, chess or chat"), m);
}
