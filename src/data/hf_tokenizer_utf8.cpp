// UTF-8 for HfTokenizer: validation, code points, Rust's lossy decoding, Unicode whitespace and
// GPT-2's byte-to-unicode table of the byte-level stages.
#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

// Length of the well-formed sequence starting at `pos` (Unicode table 3-7), 0 when ill-formed;
// `valid_prefix` gets the length of its longest well-formed prefix (the "maximal subpart").
size_t well_formed_length(std::string_view s, size_t pos, size_t& valid_prefix) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = at(pos);
  valid_prefix = 0;
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  valid_prefix = 1;
  for (size_t k = 1; k < length; ++k) {
    if (pos + k >= s.size()) return 0;
    const unsigned char b = at(pos + k);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return 0;
    valid_prefix = k + 1;
  }
  return length;
}

}  // namespace

size_t find_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t prefix = 0;
    const size_t n = well_formed_length(text, pos, prefix);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

uint32_t next_code_point(std::string_view text, size_t& pos) {
  const auto at = [&](size_t i) {
    return static_cast<uint32_t>(static_cast<unsigned char>(text[i]));
  };
  const uint32_t lead = at(pos);
  if (lead < 0x80) {
    ++pos;
    return lead;
  }
  if (lead < 0xE0) {
    const uint32_t cp = ((lead & 0x1F) << 6) | (at(pos + 1) & 0x3F);
    pos += 2;
    return cp;
  }
  if (lead < 0xF0) {
    const uint32_t cp = ((lead & 0x0F) << 12) | ((at(pos + 1) & 0x3F) << 6) | (at(pos + 2) & 0x3F);
    pos += 3;
    return cp;
  }
  const uint32_t cp = ((lead & 0x07) << 18) | ((at(pos + 1) & 0x3F) << 12) |
                      ((at(pos + 2) & 0x3F) << 6) | (at(pos + 3) & 0x3F);
  pos += 4;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t prefix = 0;
    const size_t n = well_formed_length(bytes, pos, prefix);
    if (n > 0) {
      out.append(bytes.data() + pos, n);
      pos += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart, then go on after it
      pos += prefix > 0 ? prefix : 1;
    }
  }
  return out;
}

bool is_whitespace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

struct ByteLevelTable {
  std::array<std::string, 256> chars;
  std::array<int, 324> bytes;  // code point (all below 324) -> byte
  ByteLevelTable() {
    bytes.fill(-1);
    // Printable bytes stand for themselves; the others take 256, 257, ... in byte order.
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      append_utf8(chars[b], cp);
      bytes[cp] = b;
    }
  }
};

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;
  return table;
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() { return byte_level_table().chars; }

int byte_level_byte(uint32_t cp) {
  const auto& bytes = byte_level_table().bytes;
  return cp < bytes.size() ? bytes[cp] : -1;
}

}  // namespace shardlm::hf
