#include "train/data/utf8.h"

#include "base/error.h"

namespace attograd::train::data {

std::vector<char32_t> decode_utf8(std::string_view bytes, std::string_view what) {
  std::vector<char32_t> out;
  out.reserve(bytes.size());
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  std::size_t i = 0;
  while (i < bytes.size()) {
    const unsigned char lead = byte(i);
    int extra;           // continuation bytes that follow the lead byte
    char32_t cp, least;  // least: the smallest code point this length may encode (no overlong forms)
    if (lead < 0x80) {
      out.push_back(lead);
      ++i;
      continue;
    } else if ((lead & 0xE0) == 0xC0) {
      extra = 1, cp = lead & 0x1F, least = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      extra = 2, cp = lead & 0x0F, least = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      extra = 3, cp = lead & 0x07, least = 0x10000;
    } else {
      fail(what, "invalid UTF-8 at byte {}: unexpected byte 0x{:02X}", i, lead);
    }
    AG_CHECK(i + extra < bytes.size(), what,
             "invalid UTF-8 at byte {}: sequence truncated by the end of the input", i);
    for (int k = 1; k <= extra; ++k) {
      const unsigned char c = byte(i + k);
      AG_CHECK((c & 0xC0) == 0x80, what, "invalid UTF-8 at byte {}: expected a continuation byte, got 0x{:02X}",
               i + k, c);
      cp = (cp << 6) | (c & 0x3F);
    }
    AG_CHECK(cp >= least, what, "invalid UTF-8 at byte {}: overlong encoding of U+{:04X}", i,
             static_cast<std::uint32_t>(cp));
    AG_CHECK(cp < 0xD800 || cp > 0xDFFF, what, "invalid UTF-8 at byte {}: surrogate U+{:04X}", i,
             static_cast<std::uint32_t>(cp));
    AG_CHECK(cp <= 0x10FFFF, what, "invalid UTF-8 at byte {}: U+{:X} is past U+10FFFF", i,
             static_cast<std::uint32_t>(cp));
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

std::string encode_utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string encode_utf8(const std::vector<char32_t>& code_points) {
  std::string s;
  for (char32_t cp : code_points) s += encode_utf8(cp);
  return s;
}

}  // namespace attograd::train::data
