// sentencepiece_to_tokenizer_json: a SentencePiece BPE model (tokenizer.model of Llama 2 and
// CodeLlama) as the tokenizer.json transformers' LlamaConverter writes for it (legacy form).
#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>

#include "hf_tokenizer.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

using hf::json;

// A reader for the protobuf wire format, enough for sentencepiece_model.proto.
class ProtoReader {
 public:
  ProtoReader(std::string_view data, const std::string& source) : data_(data), source_(source) {}
  bool done() const { return pos_ >= data_.size(); }
  // The next field's number and wire type; the value follows.
  void next_key(uint32_t& field, uint32_t& wire) {
    const uint64_t key = varint();
    field = static_cast<uint32_t>(key >> 3);
    wire = static_cast<uint32_t>(key & 7);
  }
  uint64_t varint() {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      result |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return result;
    }
    fail("a varint longer than 10 bytes");
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    need(n);
    const std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  float fixed32_float() {
    need(4);
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) {
      bits |= static_cast<uint32_t>(static_cast<unsigned char>(data_[pos_ + i])) << (8 * i);
    }
    pos_ += 4;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
  void skip(uint32_t wire) {
    if (wire == 0) {
      varint();
    } else if (wire == 1) {
      need(8);
      pos_ += 8;
    } else if (wire == 2) {
      bytes();
    } else if (wire == 5) {
      need(4);
      pos_ += 4;
    } else {
      fail(concat("wire type ", wire));
    }
  }

 private:
  void need(uint64_t n) const {
    if (n > data_.size() - pos_) fail("data ends inside a field");
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(concat(source_, ": not a SentencePiece model (", what, " at byte ", pos_, ")"));
  }
  std::string_view data_;
  size_t pos_ = 0;
  const std::string& source_;
};

struct SpmPiece {
  std::string piece;
  double score = 0.0;
  int type = 1;  // NORMAL=1, UNKNOWN=2, CONTROL=3, USER_DEFINED=4, UNUSED=5, BYTE=6
};

struct SpmModel {
  std::vector<SpmPiece> pieces;
  int model_type = 1;  // UNIGRAM=1, BPE=2
  bool byte_fallback = false;
  int64_t bos_id = 1;
  std::string unk_piece = "<unk>", bos_piece = "<s>";
  bool add_dummy_prefix = true;
};

// Each field of `message` in turn: read(field, wire, reader) reads the value of a field it knows and
// says so (true); the others are skipped.
template <typename Read>
void read_fields(std::string_view message, const std::string& source, Read read) {
  ProtoReader r(message, source);
  while (!r.done()) {
    uint32_t field, wire;
    r.next_key(field, wire);
    if (!read(field, wire, r)) r.skip(wire);
  }
}

SpmModel read_model(const std::string& data, const std::string& source) {
  SpmModel model;
  read_fields(data, source, [&](uint32_t field, uint32_t wire, ProtoReader& top) {
    if (wire != 2) return false;
    if (field == 1) {  // pieces
      SpmPiece p;
      read_fields(top.bytes(), source, [&](uint32_t f, uint32_t w, ProtoReader& r) {
        if (f == 1 && w == 2)
          p.piece = std::string(r.bytes());
        else if (f == 2 && w == 5)
          p.score = r.fixed32_float();
        else if (f == 3 && w == 0)
          p.type = static_cast<int>(r.varint());
        else
          return false;
        return true;
      });
      model.pieces.push_back(std::move(p));
    } else if (field == 2) {  // trainer_spec
      read_fields(top.bytes(), source, [&](uint32_t f, uint32_t w, ProtoReader& r) {
        if (f == 3 && w == 0)
          model.model_type = static_cast<int>(r.varint());
        else if (f == 35 && w == 0)
          model.byte_fallback = r.varint() != 0;
        else if (f == 41 && w == 0)
          model.bos_id = static_cast<int32_t>(static_cast<uint32_t>(r.varint()));
        else if (f == 45 && w == 2)
          model.unk_piece = std::string(r.bytes());
        else if (f == 46 && w == 2)
          model.bos_piece = std::string(r.bytes());
        else
          return false;
        return true;
      });
    } else if (field == 3) {  // normalizer_spec
      read_fields(top.bytes(), source, [&](uint32_t f, uint32_t w, ProtoReader& r) {
        if (f != 3 || w != 0) return false;
        model.add_dummy_prefix = r.varint() != 0;
        return true;
      });
    } else {
      return false;
    }
    return true;
  });
  return model;
}

// Byte offsets of the code point boundaries inside `text` (0 and size included).
std::vector<size_t> char_boundaries(const std::string& text) {
  std::vector<size_t> cuts{0};
  for (size_t i = 1; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) cuts.push_back(i);
  }
  if (!text.empty()) cuts.push_back(text.size());
  return cuts;
}

// LlamaConverter.vocab's scores as dict(vocab_scores) holds them: first-occurrence order, last score;
// ids 0..2 keep their pieces with score 0, the rest keep their scores.
std::vector<std::pair<std::string, double>> piece_scores(const SpmModel& model) {
  std::vector<std::pair<std::string, double>> scores;
  std::unordered_map<std::string, size_t> score_index;
  for (size_t i = 0; i < model.pieces.size(); ++i) {
    const double score = i < 3 ? 0.0 : model.pieces[i].score;
    const auto [it, inserted] = score_index.emplace(model.pieces[i].piece, scores.size());
    if (inserted)
      scores.emplace_back(model.pieces[i].piece, score);
    else
      scores[it->second].second = score;
  }
  return scores;
}

// transformers' generate_merges: every split of a piece into two vocabulary pieces (in id order per
// piece), then a stable sort by score, left length and right length, descending; as "left right".
json bpe_merges(const std::vector<std::pair<std::string, double>>& scores,
                const std::unordered_map<std::string, int32_t>& vocab) {
  struct Merge {
    std::string left, right;
    double score;
    size_t left_chars, right_chars;
    int32_t left_id, right_id;
  };
  std::vector<Merge> merges;
  std::vector<Merge> local;
  for (const auto& [piece, score] : scores) {
    const std::vector<size_t> cuts = char_boundaries(piece);
    const size_t n_chars = cuts.size() - 1;
    local.clear();
    for (size_t k = 1; k < n_chars; ++k) {
      std::string left = piece.substr(0, cuts[k]), right = piece.substr(cuts[k]);
      const auto l = vocab.find(left), r = vocab.find(right);
      if (l == vocab.end() || r == vocab.end()) continue;
      local.push_back({std::move(left), std::move(right), score, k, n_chars - k, l->second, r->second});
    }
    std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
      return a.left_id != b.left_id ? a.left_id < b.left_id : a.right_id < b.right_id;
    });
    for (Merge& m : local) merges.push_back(std::move(m));
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  json out = json::array();
  for (const Merge& m : merges) out.push_back(m.left + " " + m.right);
  return out;
}

// The control, user-defined and byte pieces (types 2, 3, 4) as added tokens; byte pieces are not special.
json added_tokens(const SpmModel& model) {
  json added = json::array();
  for (size_t i = 0; i < model.pieces.size(); ++i) {
    const int type = model.pieces[i].type;
    if (type != 2 && type != 3 && type != 4) continue;
    added.push_back({{"id", i},
                     {"content", model.pieces[i].piece},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", type != 4}});
  }
  return added;
}

// BOS before each sequence, as LlamaConverter's TemplateProcessing; null without a BOS piece.
json bos_post_processor(const SpmModel& model, const std::unordered_map<std::string, int32_t>& vocab) {
  const auto bos = vocab.find(model.bos_piece);
  if (model.bos_id < 0 || bos == vocab.end()) return nullptr;
  const std::string& b = model.bos_piece;
  const auto special = [&](int type_id) { return json{{"SpecialToken", {{"id", b}, {"type_id", type_id}}}}; };
  const auto sequence = [](const char* id, int type_id) { return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  return {{"type", "TemplateProcessing"},
          {"single", json::array({special(0), sequence("A", 0)})},
          {"pair", json::array({special(0), sequence("A", 0), special(1), sequence("B", 1)})},
          {"special_tokens", {{b, {{"id", b}, {"ids", json::array({bos->second})}, {"tokens", json::array({b})}}}}}};
}

}  // namespace

std::string sentencepiece_to_tokenizer_json(const std::string& model_path) {
  const SpmModel model = read_model(read_input_file(model_path, "SentencePiece model", kMaxTokenizerBytes), model_path);
  SHARDLM_CHECK(!model.pieces.empty(), model_path, ": not a SentencePiece model (no pieces)");
  SHARDLM_CHECK(model.model_type == 2, model_path, ": SentencePiece model_type ", model.model_type,
                " is not BPE (2); only BPE models convert to a BPE tokenizer.json");
  std::unordered_map<std::string, int32_t> vocab;
  for (size_t i = 0; i < model.pieces.size(); ++i) vocab[model.pieces[i].piece] = static_cast<int32_t>(i);
  json vocab_json = json::object();
  for (const auto& [piece, id] : vocab) vocab_json[piece] = id;

  json normalizers = json::array();
  if (model.add_dummy_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
  json decoders = json::array({
      {{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
      {{"type", "ByteFallback"}},
      {{"type", "Fuse"}},
  });
  if (model.add_dummy_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});

  const json unk_token = vocab.count(model.unk_piece) ? json(model.unk_piece) : json(nullptr);
  json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added_tokens(model)},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", std::move(normalizers)}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", bos_post_processor(model, vocab)},
      {"decoder", {{"type", "Sequence"}, {"decoders", std::move(decoders)}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", unk_token},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", model.byte_fallback},
        {"ignore_merges", false},
        {"vocab", std::move(vocab_json)},
        {"merges", bpe_merges(piece_scores(model), vocab)}}},
  };
  return tokenizer.dump();
}

}  // namespace shardlm
