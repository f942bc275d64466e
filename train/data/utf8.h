#pragma once
// UTF-8 to Unicode code points and back. Invalid input is an error naming the
// byte offset where decoding failed, so a user can find it in their file.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace attograd::train::data {

// Throws "[what] invalid UTF-8 at byte N: ..." on overlong forms, surrogates,
// truncated sequences, stray continuation bytes and code points past U+10FFFF.
std::vector<char32_t> decode_utf8(std::string_view bytes, std::string_view what = "utf8");
std::string encode_utf8(char32_t code_point);
std::string encode_utf8(const std::vector<char32_t>& code_points);

}  // namespace attograd::train::data
