#pragma once
/// \file
/// `detail::printable`: what a user wrote (a key, a file name, a path), made safe to print in a message.

#include <cstddef>
#include <string>
#include <string_view>

namespace zero::detail {

/// `text` with every byte a terminal could misread made visible: control bytes and bytes that are
/// not part of valid UTF-8 become `\xNN`; valid UTF-8 is kept.
/// Messages pass what a user wrote (keys, file names, JSON parse excerpts) through it.
[[nodiscard]] inline std::string printable(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char b) {
    out += "\\x";
    out += hex[b >> 4];
    out += hex[b & 0xf];
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if (b < 0x20 || b == 0x7f) {
        escape(b);
      } else {
        out += static_cast<char>(b);
      }
      ++i;
      continue;
    }
    // The length of a UTF-8 sequence by its lead byte, and the range its second byte must fall in
    // (which refuses overlong forms, surrogates and code points past U+10FFFF).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) {
      len = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
      len = 3;
      lo = b == 0xe0 ? 0xa0 : 0x80;
      hi = b == 0xed ? 0x9f : 0xbf;
    } else if (b >= 0xf0 && b <= 0xf4) {
      len = 4;
      lo = b == 0xf0 ? 0x90 : 0x80;
      hi = b == 0xf4 ? 0x8f : 0xbf;
    }
    bool valid = len != 0 && i + len <= text.size();
    for (std::size_t k = 1; valid && k < len; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      valid = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xbf);
    }
    if (valid) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      escape(b);
      ++i;
    }
  }
  return out;
}

} // namespace zero::detail
