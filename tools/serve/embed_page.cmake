# Writes OUT, a C++ file defining dsv4::serve::kChatPage with the bytes of IN
# (the chat page), as hex so that no character of the page needs escaping.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," body "${hex}")
file(WRITE ${OUT} "// Generated from ${IN} by tools/serve/embed_page.cmake.\n#include <string_view>\nnamespace dsv4::serve {\nstatic const char kPageBytes[] = {${body} 0};\nextern const std::string_view kChatPage(kPageBytes, ${bytes});\n}  // namespace dsv4::serve\n")
