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
    const size_t from = given_ > stop.size() ? given_ - stop.size() : 0;
    if (const size_t at = text.find(stop, from); at != std::string::npos && at <= end) {
      stopped_ = true;
      end = std::min(end, at);
    }
  }
  if (!stopped_)
    // Hold back the longest end of the text that begins a stop string.
    for (const std::string& stop : stop_strings_)
      for (size_t n = std::min(stop.size() - 1, end); n > 0; --n)
        if (text.compare(end - n, n, stop, 0, n) == 0) {
          end -= n;
          break;
        }
  if (end <= given_) return "";
  std::string out = text.substr(given_, end - given_);
  given_ = end;
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return "";
  const std::string text = tok_.decode(ids_);
  std::string out = text.size() > given_ ? text.substr(given_) : "";
  given_ = text.size();
  return out;
}

}  // namespace shardlm
