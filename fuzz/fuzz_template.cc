// Chat templates (src/chat): any text as a template, parsed and rendered with a fixed context
// (a conversation with a system prompt, tool calls, tool results and tools). Every failure must
// be a hybridlm::Error with a one-line message, and the limits must hold.
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "chat/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful. /no_think"},
      {"role": "user", "content": "Weather in Zürich? 🙂 \"quoted\" </s>"},
      {"role": "assistant", "content": "<think>\nneed a tool\n</think>\n\n",
       "tool_calls": [{"type": "function", "id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
                      {"type": "function", "id": "c2", "function": {"name": "search", "arguments": "{\"q\": \"x\"}"}}]},
      {"role": "tool", "content": "{\"temp\": 21.5}"},
      {"role": "assistant", "content": "It is 21.5 degrees.", "reasoning_content": "read the tool"},
      {"role": "user", "content": ""}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "add_generation_prompt": true,
    "enable_thinking": false,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "n": 3, "f": 1.5, "nothing": null
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  chat::Limits lim;
  lim.max_loop_iterations = 20'000;  // keeps every input well under libFuzzer's 1 s timeout
  lim.max_output_bytes = 1 << 16;
  chat::RenderOptions opt;
  opt.now = 1721952000;
  try {
    const chat::Template t = chat::Template::parse(src, lim);
    const std::string out = t.render(context(), opt);
    if (out.size() > lim.max_output_bytes) std::abort();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find('\n') != std::string::npos || msg.rfind("chat template", 0) != 0) std::abort();
  }
  return 0;
}
