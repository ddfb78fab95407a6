// The chat page served at `/` (tools/serve/chat_page.html, embedded at build
// time by tools/serve/embed_page.cmake).
#pragma once
#include <string_view>

namespace dsv4::serve {
extern const std::string_view kChatPage;
}  // namespace dsv4::serve
