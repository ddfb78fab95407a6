#include "io/text_stream.h"

#include <algorithm>

namespace dsv4 {

size_t utf8_incomplete_tail(const std::string& s) {
  for (size_t k = std::min<size_t>(3, s.size()); k >= 1; --k) {
    const std::string_view tail(s.data() + s.size() - k, k);
    const unsigned char lead = static_cast<unsigned char>(tail[0]);
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (need <= k) continue;
    // A prefix of a valid character: some continuation completes it. The
    // second byte's allowed range depends on the lead (E0: A0..BF, ED:
    // 80..9F, F0: 90..BF, F4: 80..8F), and one of 80, 90, A0 repeated is in
    // each.
    for (const char fill : {'\x80', '\x90', '\xA0'}) {
      const std::string whole = std::string(tail) + std::string(need - k, fill);
      if (utf8_char_length(whole) == need) return k;
    }
  }
  return 0;
}

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stops) : tok_(tok), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const std::string& s : stops_) longest_stop_ = std::max(longest_stop_, s.size());
}

std::string TextStream::release(size_t end) {
  const std::string out = utf8_lossy(std::string_view(bytes_).substr(released_, end - released_));
  released_ = end;
  return out;
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return {};
  const size_t before = bytes_.size();
  const int32_t one[1] = {id};
  bytes_ += tok_.decode(one);
  // A stop string that appears now ends at or after `before`, so it starts
  // at most longest − 1 bytes earlier: everything before that was searched.
  const size_t from = before >= longest_stop_ ? before - longest_stop_ + 1 : 0;
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, bytes_.find(s, from));
  if (cut != std::string::npos) {
    stopped_ = true;
    bytes_.resize(cut);
    return release(cut);
  }
  // Hold back what could begin a stop string, and a character cut short.
  size_t hold = utf8_incomplete_tail(bytes_);
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, bytes_.size()); k > hold; --k)
      if (bytes_.compare(bytes_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return release(std::max(released_, bytes_.size() - hold));
}

std::string TextStream::finish() { return release(bytes_.size()); }

std::string TextStream::text() const { return utf8_lossy(bytes_); }

}  // namespace dsv4
