// dsv4 chat: a conversation, one user turn per line of input, each answered
// by the shared generation loop over the whole conversation rendered in the
// V4 chat layout, resumed from the prefix cache.
#pragma once
#include <istream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "generation.h"

namespace dsv4::cli {

struct ChatSettings {
  bool has_system = false;
  std::string system;
  bool think = false;              // thinking mode (reasoning, then the answer)
  GenerationParams generation;     // max_new_tokens: per answer
  std::vector<std::string> stops;  // end an answer at these strings
  bool json = false;               // one object per turn instead of streamed text
  bool terminal_in = false;        // a "> " prompt on stderr before each line
  bool terminal_out = false;       // reasoning dimmed (else inside <think>...</think>)
};

// Runs the conversation until `in` ends; the engine has a tokenizer and its
// cache pool holds a session at the position limit.
void run_chat(Engine& engine, const ChatSettings& s, std::istream& in);

}  // namespace dsv4::cli
