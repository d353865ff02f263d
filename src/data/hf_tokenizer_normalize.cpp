// Normalizers of HfTokenizer: Sequence, Prepend, Replace, Strip, ByteLevel and the Unicode normal forms (NFC,
// NFD, NFKC, NFKD: Qwen2's and Qwen3's tokenizers take NFC), as `tokenizers` applies them to each stretch of
// text between added tokens.
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

class SequenceNormalizer : public SequenceOf<Normalizer, std::string, &Normalizer::normalize> {
 public:
  using SequenceOf::SequenceOf;
  void normalize(std::string& text) const override { apply_each(text); }
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    thread_local std::vector<std::pair<size_t, size_t>> matches;
    pattern_.replace_all(text, content_, matches);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      size_t pos = 0;
      while (pos < end) {
        size_t next = pos;
        if (!is_whitespace(next_code_point(text, next))) break;
        pos = next;
      }
      begin = pos;
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;  // back to the lead byte of the last code point
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t pos = start;
        if (!is_whitespace(next_code_point(text, pos))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class ByteLevelNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    const auto& chars = byte_level_chars();
    std::string out;
    out.reserve(text.size() * 2);
    for (unsigned char b : text) out += chars[b];
    text.swap(out);
  }
};

// A Unicode normal form through ICU (the same Unicode data `tokenizers`' unicode-normalization crate follows).
class UnicodeFormNormalizer : public Normalizer {
 public:
  UnicodeFormNormalizer(const icu::Normalizer2* form, std::string name) : form_(form), name_(std::move(name)) {}
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    icu::StringByteSink<std::string> sink(&out);
    UErrorCode status = U_ZERO_ERROR;
    form_->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink, nullptr, status);
    SHARDLM_CHECK(U_SUCCESS(status), "tokenizer normalizer ", name_, ": ", u_errorName(status));
    text.swap(out);
  }

 private:
  const icu::Normalizer2* form_;  // ICU's singleton
  std::string name_;
};

const icu::Normalizer2* unicode_form(const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                 : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                 : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                 : type == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                                  : nullptr;
  SHARDLM_CHECK(U_SUCCESS(status), "ICU's ", type, " normalizer: ", u_errorName(status));
  return form;
}

}  // namespace

constexpr const char* kNormalizerTypes = "Sequence, Prepend, Replace, Strip, ByteLevel, NFC, NFD, NFKC, NFKD";

// The component's own types, nullptr for any other (parse_component handles null and Sequence
// and refuses the others).
static std::unique_ptr<Normalizer> parse_normalizer_type(const JsonContext& ctx, const json& value,
                                                         const std::string& path, const std::string& type) {
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(require_string(ctx, value, path, "prepend"));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(
        parse_pattern(ctx, require_member(ctx, value, path, "pattern"),
                      child_path(path, "pattern")),
        require_string(ctx, value, path, "content"));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(optional_bool(ctx, value, path, "strip_left", true),
                                             optional_bool(ctx, value, path, "strip_right", true));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (const icu::Normalizer2* form = unicode_form(type)) return std::make_unique<UnicodeFormNormalizer>(form, type);
  return nullptr;
}

std::unique_ptr<Normalizer> parse_normalizer(const JsonContext& ctx, const json& value, const std::string& path) {
  return parse_component<Normalizer, SequenceNormalizer>(ctx, value, path, "normalizers", parse_normalizer,
                                                         parse_normalizer_type, kNormalizerTypes);
}

}  // namespace shardlm::hf
