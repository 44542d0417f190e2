// OpenAI's wire format (docs/serving.md; ../shared/research/openai-api-and-chat-templates.md):
// request bodies of /v1/completions and /v1/chat/completions checked field by field into
// generation parameters, and the response objects and stream chunks the official client reads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/scheduler.h"

namespace hybridlm {

// A request the server refuses: the HTTP status and OpenAI's error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the field at fault ("" = null)
  std::string code;   // "" = null
};
// An error of `status` with OpenAI's type for it; control characters in the message become spaces.
ApiError api_error(int status, std::string message, std::string param = "", std::string code = "");
[[noreturn]] void throw_api(int status, std::string param, std::string message, std::string code = "");
// {"error": {"message", "type", "param", "code"}}
nlohmann::ordered_json error_body(const ApiError& e);

struct ApiRequest {
  bool chat = false;
  bool stream = false, include_usage = false, echo = false;
  std::string model;  // as the client named it ("" when absent)
  // Completions: the prompt as text, or as ids (prompt_ids set, prompt_text empty).
  std::string prompt_text;
  std::optional<std::vector<int32_t>> prompt_ids;
  // Chat: the messages as given (checked), and the tools (null when absent).
  nlohmann::ordered_json messages, tools;
  std::optional<int> max_tokens;                // absent: completions 16, chat until the context is full
  std::string max_tokens_field = "max_tokens";  // the field it came from (chat: or max_completion_tokens)
  int logprobs = -1;  // -1: none; else how many alternatives per token (completions' logprobs, chat's top_logprobs)
  GenRequest gen;     // everything but the prompt ids and max_tokens
  bool seed_given = false;
};

// Parses and checks a request body; throws ApiError (400) naming the field. The model name is
// checked by the caller (it knows which models it serves).
ApiRequest parse_request(const std::string& body, bool chat);

// "cmpl-..." / "chatcmpl-..." with 24 random alphanumerics.
std::string make_id(const char* prefix);

// The logprobs of generated tokens in the two shapes: completions' four parallel arrays, chat's
// list of {token, logprob, bytes, top_logprobs}. Completions: the echoed prompt's tokens first
// (`prompt`, offsets from 0), then the generated ones from `text_offset0` (the echo's length).
nlohmann::ordered_json completion_logprobs(const std::vector<TokenLogprob>& prompt,
                                           const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                                           size_t text_offset0);
nlohmann::ordered_json chat_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok);

nlohmann::ordered_json usage_json(const Usage& u);

}  // namespace hybridlm
