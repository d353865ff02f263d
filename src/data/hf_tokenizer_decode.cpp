// Decoders of HfTokenizer: Sequence, ByteLevel (back to bytes), Replace, ByteFallback (<0xNN>
// tokens to bytes), Fuse, Strip and Metaspace, each one step of `tokenizers`' decode chain.
#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

class SequenceDecoder : public SequenceOf<Decoder, std::vector<std::string>, &Decoder::decode_chain> {
 public:
  using SequenceOf::SequenceOf;
  void decode_chain(std::vector<std::string>& tokens) const override { apply_each(tokens); }
};

// All tokens become one string: each character back to its byte (a token with a character
// outside the table contributes its own bytes), then UTF-8 decoded lossily.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const size_t mark = bytes.size();
      size_t pos = 0;
      bool mapped = true;
      while (pos < token.size()) {
        const int b = byte_level_byte(next_code_point(token, pos));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for (std::string& token : tokens) pattern_.replace_all(token, content_, matches);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become the text of their bytes, or one U+FFFD per byte when the run is
// not valid UTF-8.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    const auto flush = [&] {
      if (run.empty()) return;
      if (find_invalid_utf8(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (std::string& token : tokens) {
      const int byte = parse_byte_token(token);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // "<0xNN>" -> NN, else -1.
  static int parse_byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    const int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<size_t> offsets;  // byte offset of each character, and the end
    for (std::string& token : tokens) {
      offsets.clear();
      std::vector<uint32_t> chars;
      size_t pos = 0;
      while (pos < token.size()) {
        offsets.push_back(pos);
        chars.push_back(next_code_point(token, pos));
      }
      offsets.push_back(token.size());
      size_t first = 0;
      while (first < chars.size() && first < start_ && chars[first] == content_) ++first;
      size_t last = chars.size();
      for (size_t i = 0; i < stop_ && last > first && chars[last - 1] == content_; ++i) --last;
      token = token.substr(offsets[first], offsets[last] - offsets[first]);
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

// Each replacement character becomes a space, except in the first token, where it is dropped
// (unless the prepend scheme is "never").
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(uint32_t replacement, bool drop_in_first)
      : replacement_(replacement), drop_in_first_(drop_in_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string& token = tokens[i];
      std::string out;
      size_t pos = 0;
      while (pos < token.size()) {
        const size_t start = pos;
        const uint32_t cp = next_code_point(token, pos);
        if (cp == replacement_) {
          if (!(i == 0 && drop_in_first_)) out += ' ';
        } else {
          out.append(token, start, pos - start);
        }
      }
      tokens[i].swap(out);
    }
  }

 private:
  uint32_t replacement_;
  bool drop_in_first_;
};

// The one character of a string member, as a code point.
uint32_t single_char(const JsonContext& ctx, const json& object, const std::string& path,
                     const char* key) {
  const std::string text = require_string(ctx, object, path, key);
  size_t pos = 0;
  if (text.empty() || find_invalid_utf8(text) != std::string::npos) {
    ctx.fail(child_path(path, key), "expected one character");
  }
  const uint32_t cp = next_code_point(text, pos);
  if (pos != text.size()) ctx.fail(child_path(path, key), "expected one character");
  return cp;
}

}  // namespace

constexpr const char* kDecoderTypes = "Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace";

// The component's own types, nullptr for any other (parse_component handles null and Sequence
// and refuses the others).
static std::unique_ptr<Decoder> parse_decoder_type(const JsonContext& ctx, const json& value,
                                                   const std::string& path, const std::string& type) {
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(
        parse_pattern(ctx, require_member(ctx, value, path, "pattern"),
                      child_path(path, "pattern")),
        require_string(ctx, value, path, "content"));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const int64_t start = optional_int(ctx, value, path, "start", 0);
    const int64_t stop = optional_int(ctx, value, path, "stop", 0);
    if (start < 0 || stop < 0) ctx.fail(path, "start and stop must not be negative");
    return std::make_unique<StripDecoder>(single_char(ctx, value, path, "content"),
                                          static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  if (type == "Metaspace") {
    const bool add_prefix_space = optional_bool(ctx, value, path, "add_prefix_space", true);
    const std::string scheme =
        optional_string(ctx, value, path, "prepend_scheme", add_prefix_space ? "always" : "never");
    return std::make_unique<MetaspaceDecoder>(single_char(ctx, value, path, "replacement"),
                                              scheme != "never");
  }
  return nullptr;
}

std::unique_ptr<Decoder> parse_decoder(const JsonContext& ctx, const json& value, const std::string& path) {
  return parse_component<Decoder, SequenceDecoder>(ctx, value, path, "decoders", parse_decoder,
                                                   parse_decoder_type, kDecoderTypes);
}

}  // namespace shardlm::hf
