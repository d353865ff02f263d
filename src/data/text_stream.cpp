// TextStream: the decoded text of a growing sequence of ids, given out once it is final (streaming
// generation: `shardlm generate` prints it as tokens come).
#include <algorithm>

#include "shardlm/data.hpp"

namespace shardlm {
namespace {

// Where the final text of `text` ends: before a trailing U+FFFD (a character whose bytes have not
// all come) and before an incomplete UTF-8 sequence at the end.
size_t settled_end(const std::string& text) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  size_t end = text.size();
  while (end >= kReplacement.size() && text.compare(end - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
    end -= kReplacement.size();
  // The last lead byte among the last three: its sequence must be whole.
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (length > back) end -= back;
    break;
  }
  return end;
}

// The bytes a and b share from the start, moved back to the start of a character of a.
size_t common_characters(const std::string& a, const std::string& b) {
  size_t n = std::mismatch(a.begin(), a.begin() + static_cast<long>(std::min(a.size(), b.size())), b.begin()).first -
             a.begin();
  while (n > 0 && n < a.size() && (static_cast<unsigned char>(a[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stop_strings)
    : tok_(tok), stop_strings_(std::move(stop_strings)) {
  stop_strings_.erase(std::remove(stop_strings_.begin(), stop_strings_.end(), std::string()), stop_strings_.end());
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return "";
  ids_.push_back(id);
  // The whole sequence again: a tokenizer's decode of a prefix need not be a prefix of its decode
  // (SentencePiece's leading space, byte fallback), and answers are short.
  const std::string text = tok_.decode(ids_);
  size_t end = settled_end(text);
  for (const std::string& stop : stop_strings_) {
    const size_t from = given_.size() > stop.size() ? given_.size() - stop.size() : 0;
    if (const size_t at = text.find(stop, from); at != std::string::npos && at <= end) {
      stopped_ = true;
      end = std::min(end, at);
    }
  }
  if (stopped_) {
    stop_text_ = text.substr(0, end);
  } else {
    // Hold back the longest end of the text that begins a stop string.
    for (const std::string& stop : stop_strings_)
      for (size_t n = std::min(stop.size() - 1, end); n > 0; --n)
        if (text.compare(end - n, n, stop, 0, n) == 0) {
          end -= n;
          break;
        }
    // And what the last decode did not have: given out once two decodes agree on it.
    const std::string settled = text.substr(0, end);
    end = common_characters(settled, settled_);
    settled_ = settled;
  }
  if (end <= given_.size() || text.compare(0, given_.size(), given_) != 0) return "";
  std::string out = text.substr(given_.size(), end - given_.size());
  given_ += out;
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return "";
  const std::string text = tok_.decode(ids_);
  const size_t from = common_characters(text, given_);
  std::string out = text.substr(from);
  given_ = text;
  return out;
}

std::string TextStream::text() const { return stopped_ ? stop_text_ : tok_.decode(ids_); }

}  // namespace shardlm
