// Pre-tokenizers of HfTokenizer: Sequence, ByteLevel (GPT-2's split regex and byte-to-unicode
// mapping), Split (a pattern and a behavior: BLOOM, Llama 3), Metaspace and Digits.
#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

// GPT-2's pre-tokenization regex, used by ByteLevel with use_regex.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Applies `f(piece, out)` to each piece that is not an added token, keeping the others in place.
template <typename F>
void for_each_text_piece(std::vector<Piece>& pieces, F&& f) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  for (Piece& piece : pieces) {
    if (piece.id >= 0) {
      out.push_back(std::move(piece));
    } else {
      f(std::move(piece), out);
    }
  }
  pieces.swap(out);
}

class SequencePreTokenizer : public SequenceOf<PreTokenizer, std::vector<Piece>, &PreTokenizer::pre_tokenize> {
 public:
  using SequenceOf::SequenceOf;
  void pre_tokenize(std::vector<Piece>& pieces) const override { apply_each(pieces); }
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) {
      static const auto regex = std::make_shared<const Regex>(kGpt2Pattern);
      pattern_.regex = regex;
    }
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    const auto& chars = byte_level_chars();
    for_each_text_piece(pieces, [&](Piece piece, std::vector<Piece>& out) {
      if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' ')) {
        piece.text.insert(0, 1, ' ');
      }
      const size_t first = out.size();
      if (pattern_.regex) {
        split_piece(pattern_, SplitBehavior::Isolated, false, std::move(piece), out);
      } else if (!piece.text.empty()) {
        out.push_back(std::move(piece));
      }
      // Every byte becomes the printable character standing for it.
      std::string mapped;
      for (size_t k = first; k < out.size(); ++k) {
        mapped.clear();
        for (unsigned char b : out[k].text) mapped += chars[b];
        out[k].text.swap(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_;
  Pattern pattern_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for_each_text_piece(pieces, [&](Piece piece, std::vector<Piece>& out) {
      split_piece(pattern_, behavior_, invert_, std::move(piece), out);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

enum class PrependScheme { Always, Never, First };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    split_pattern_.literal = replacement_;
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for_each_text_piece(pieces, [&](Piece piece, std::vector<Piece>& out) {
      std::string& text = piece.text;
      std::string replaced;
      replaced.reserve(text.size() + replacement_.size());
      for (char c : text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool starts = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::Always ||
                      (scheme_ == PrependScheme::First && piece.at_start))) {
        replaced.insert(0, replacement_);
      }
      text.swap(replaced);
      if (split_) {
        split_piece(split_pattern_, SplitBehavior::MergedWithNext, false, std::move(piece), out);
      } else if (!text.empty()) {
        out.push_back(std::move(piece));
      }
    });
  }

 private:
  std::string replacement_;
  Pattern split_pattern_;
  PrependScheme scheme_;
  bool split_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) {
    static const auto one = std::make_shared<const Regex>("\\p{N}");
    static const auto run = std::make_shared<const Regex>("\\p{N}+");
    pattern_.regex = individual ? one : run;
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for_each_text_piece(pieces, [&](Piece piece, std::vector<Piece>& out) {
      split_piece(pattern_, SplitBehavior::Isolated, false, std::move(piece), out);
    });
  }

 private:
  Pattern pattern_;
};

}  // namespace

constexpr const char* kPreTokenizerTypes = "Sequence, ByteLevel, Split, Metaspace, Digits";

// The component's own types, nullptr for any other (parse_component handles null and Sequence
// and refuses the others).
static std::unique_ptr<PreTokenizer> parse_pre_tokenizer_type(const JsonContext& ctx, const json& value,
                                                              const std::string& path, const std::string& type) {
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(
        optional_bool(ctx, value, path, "add_prefix_space", true),
        optional_bool(ctx, value, path, "use_regex", true));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        parse_pattern(ctx, require_member(ctx, value, path, "pattern"),
                      child_path(path, "pattern")),
        parse_split_behavior(ctx, require_member(ctx, value, path, "behavior"),
                             child_path(path, "behavior")),
        optional_bool(ctx, value, path, "invert", false));
  }
  if (type == "Metaspace") {
    const std::string replacement = require_string(ctx, value, path, "replacement");
    size_t pos = 0;
    if (replacement.empty() || (next_code_point(replacement, pos), pos != replacement.size())) {
      ctx.fail(child_path(path, "replacement"), "expected one character");
    }
    // Older files say add_prefix_space instead of prepend_scheme.
    const bool add_prefix_space = optional_bool(ctx, value, path, "add_prefix_space", true);
    const std::string scheme =
        optional_string(ctx, value, path, "prepend_scheme", add_prefix_space ? "always" : "never");
    PrependScheme prepend;
    if (scheme == "always") {
      prepend = PrependScheme::Always;
    } else if (scheme == "never") {
      prepend = PrependScheme::Never;
    } else if (scheme == "first") {
      prepend = PrependScheme::First;
    } else {
      ctx.fail(child_path(path, "prepend_scheme"),
               concat("unknown prepend_scheme '", scheme, "' (always, never, first)"));
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, prepend,
                                                   optional_bool(ctx, value, path, "split", true));
  }
  if (type == "Digits") {
    return std::make_unique<DigitsPreTokenizer>(
        optional_bool(ctx, value, path, "individual_digits", false));
  }
  return nullptr;
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const JsonContext& ctx, const json& value, const std::string& path) {
  return parse_component<PreTokenizer, SequencePreTokenizer>(ctx, value, path, "pretokenizers", parse_pre_tokenizer,
                                                             parse_pre_tokenizer_type, kPreTokenizerTypes);
}

}  // namespace shardlm::hf
