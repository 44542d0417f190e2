// A request body from anyone, as /v1/completions and /v1/chat/completions read it: any bytes are a
// clean ApiError or generation parameters the sampler and the scheduler accept.
#include <cstdlib>

#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    try {
      const ApiRequest r = parse_request(body, chat);
      const GenRequest& g = r.gen;
      if (g.n < 1 || g.n > 128 || g.top_logprobs > 20 || (r.max_tokens && *r.max_tokens < 0)) std::abort();
      for (const std::string& s : g.stop)
        if (s.empty()) std::abort();
      validate(g.sampling);  // what parse_request let through, the sampler must take
      if (chat && (!r.messages.is_array() || r.messages.empty())) std::abort();
      if (!chat && r.prompt_ids && r.prompt_ids->empty()) std::abort();
      if (r.include_usage && !r.stream) std::abort();
    } catch (const ApiError& e) {
      if (e.status != 400 && e.status != 404) std::abort();
      if (e.message.empty() || e.message.find('\n') != std::string::npos) std::abort();
    }
  }
  return 0;
}
