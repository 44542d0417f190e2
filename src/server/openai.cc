#include "server/openai.h"

#include <cmath>
#include <limits>
#include <random>

namespace hybridlm {

using json = nlohmann::ordered_json;  // keys in the order written: requests as sent, responses as OpenAI lists them

namespace {

// OpenAI's error type for an HTTP status.
const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 503:
      return "service_unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

}  // namespace

ApiError api_error(int status, std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = status;
  e.type = error_type(status);
  e.param = std::move(param);
  // One line whatever the request held (parse errors quote the bytes they stopped at).
  for (char& c : message)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

void throw_api(int status, std::string param, std::string message, std::string code) {
  throw api_error(status, std::move(message), std::move(param), std::move(code));
}

json error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

[[noreturn]] void bad(const std::string& field, const std::string& what, const json& got) {
  std::string shown = got.dump(-1, ' ', false, json::error_handler_t::replace);
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  throw_api(400, field, field + " must be " + what + ", got " + shown + " (" + type_name(got) + ")");
}

// A present, non-null field (null means "the default", as OpenAI's schema marks them nullable).
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double lo, double hi, double dflt) {
  const json* v = field(body, name);
  if (!v) return dflt;
  if (!v->is_number()) bad(name, "a number", *v);
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "a number in [%g, %g]", lo, hi);
    bad(name, range, *v);
  }
  return x;
}

int64_t integer(const json& body, const char* name, int64_t lo, int64_t hi, int64_t dflt) {
  const json* v = field(body, name);
  if (!v) return dflt;
  // 5.0 is accepted as 5 (JavaScript clients cannot tell them apart); 5.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!(std::floor(d) == d && d >= -9.0e18 && d <= 9.0e18)) bad(name, "an integer", *v);
  } else if (!v->is_number_integer()) {
    bad(name, "an integer", *v);
  }
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX
                    : v->is_number_float() ? static_cast<int64_t>(v->get<double>())
                                           : v->get<int64_t>();
  if (x < lo || x > hi) bad(name, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", *v);
  return x;
}

bool boolean(const json& body, const char* name, bool dflt) {
  const json* v = field(body, name);
  if (!v) return dflt;
  if (!v->is_boolean()) bad(name, "true or false", *v);
  return v->get<bool>();
}

std::vector<int32_t> id_list(const json& v, const std::string& name) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& x = v[i];
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      bad(name + "[" + std::to_string(i) + "]", "a token id (an integer >= 0)", x);
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(const json& body, ApiRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) throw_api(400, "prompt", "prompt is required");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array() || p->empty())
    bad("prompt", "a string, an array of token ids, or a one-element array of them", *p);
  const json& first = (*p)[0];
  if (first.is_number()) {
    r.prompt_ids = id_list(*p, "prompt");
    return;
  }
  if (p->size() > 1)
    throw_api(400, "prompt", "several prompts in one request are not supported: send one request per prompt");
  if (first.is_string()) {
    r.prompt_text = first.get<std::string>();
  } else if (first.is_array() && !first.empty()) {
    r.prompt_ids = id_list(first, "prompt[0]");
  } else {
    bad("prompt[0]", "a string or an array of token ids", first);
  }
}

// Roles and content as OpenAI's schema has them; content parts are kept (the template decides).
void check_messages(const json& body, ApiRequest& r) {
  const json* m = field(body, "messages");
  if (!m) throw_api(400, "messages", "messages is required");
  if (!m->is_array()) bad("messages", "an array of messages", *m);
  if (m->empty()) throw_api(400, "messages", "messages must hold at least one message");
  for (size_t i = 0; i < m->size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const json& msg = (*m)[i];
    if (!msg.is_object()) bad(at, "an object with role and content", msg);
    const json* role = field(msg, "role");
    if (!role) throw_api(400, at + ".role", at + ".role is required");
    if (!role->is_string()) bad(at + ".role", "a string", *role);
    const std::string rs = role->get<std::string>();
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    if (std::find(std::begin(kRoles), std::end(kRoles), rs) == std::end(kRoles))
      throw_api(400, at + ".role",
                at + ".role must be one of system, developer, user, assistant, tool, function; got " +
                    role->dump(-1, ' ', false, json::error_handler_t::replace));
    const json* content = field(msg, "content");
    if (!content) {
      if (rs != "assistant" || !field(msg, "tool_calls"))
        throw_api(400, at + ".content", at + ".content is required for a " + rs + " message");
      continue;
    }
    if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string pat = at + ".content[" + std::to_string(j) + "]";
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw_api(400, pat,
                    pat + " must be a text part {\"type\": \"text\", \"text\": ...} (this model reads text only)");
      }
    } else if (!content->is_string()) {
      bad(at + ".content", "a string or an array of text parts", *content);
    }
  }
  r.messages = *m;
  if (const json* t = field(body, "tools")) {
    if (!t->is_array()) bad("tools", "an array of tools", *t);
    r.tools = *t;
  }
}

}  // namespace

ApiRequest parse_request(const std::string& body_text, bool chat) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {
    // nlohmann's message names the byte; it also rejects strings that are not valid UTF-8, and a
    // number beyond double's range (out_of_range, not parse_error: found by fuzz_request).
    std::string what = e.what();
    if (const size_t k = what.find("] "); k != std::string::npos) what = what.substr(k + 2);
    throw_api(400, "", "the request body is not valid JSON: " + what);
  }
  if (!body.is_object()) throw_api(400, "", "the request body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) bad("model", "a string", *m);
    r.model = m->get<std::string>();
  }
  if (chat) {
    check_messages(body, r);
  } else {
    parse_prompt(body, r);
  }
  for (const char* unsupported : {"best_of", "suffix", "logit_bias", "functions", "audio", "prediction"})
    if (field(body, unsupported))
      throw_api(400, unsupported, std::string(unsupported) + " is not supported by this server");
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || (*rf)["type"] != "text")
      throw_api(400, "response_format", "response_format: only {\"type\": \"text\"} is supported");
  }
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "an object", *so);
    if (!r.stream) throw_api(400, "stream_options", "stream_options is only allowed with stream: true");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  const int64_t kMaxTokens = INT32_MAX / 2;
  if (chat && field(body, "max_completion_tokens")) {
    r.max_tokens = static_cast<int>(integer(body, "max_completion_tokens", 0, kMaxTokens, 0));
    r.max_tokens_field = "max_completion_tokens";
  } else if (field(body, "max_tokens")) {
    r.max_tokens = static_cast<int>(integer(body, "max_tokens", 0, kMaxTokens, 0));
  }
  GenRequest& g = r.gen;
  SamplingParams& s = g.sampling;
  s.temperature = static_cast<float>(number(body, "temperature", 0, 2, s.temperature));
  s.top_p = static_cast<float>(number(body, "top_p", 0, 1, s.top_p));
  if (field(body, "top_p") && s.top_p <= 0) bad("top_p", "a number in (0, 1]", body["top_p"]);
  s.top_k = static_cast<int>(integer(body, "top_k", 0, 1 << 30, s.top_k));
  s.min_p = static_cast<float>(number(body, "min_p", 0, 1, s.min_p));
  s.presence_penalty = static_cast<float>(number(body, "presence_penalty", -2, 2, 0));
  s.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", -2, 2, 0));
  s.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 1e-3, 100, 1));
  if (field(body, "seed")) {
    r.seed_given = true;
    s.seed = static_cast<uint64_t>(integer(body, "seed", INT64_MIN, INT64_MAX, 0));
  }
  g.n = static_cast<int>(integer(body, "n", 1, 128, 1));
  if (const json* st = field(body, "stop")) {
    if (st->is_string()) {
      g.stop.push_back(st->get<std::string>());
    } else if (st->is_array() && st->size() <= 16) {
      for (size_t i = 0; i < st->size(); ++i) {
        if (!(*st)[i].is_string() || (*st)[i].get<std::string>().empty())
          bad("stop[" + std::to_string(i) + "]", "a non-empty string", (*st)[i]);
        g.stop.push_back((*st)[i].get<std::string>());
      }
    } else {
      bad("stop", "a string or an array of at most 16 strings", *st);
    }
    for (const std::string& x : g.stop)
      if (x.empty()) throw_api(400, "stop", "stop strings must not be empty");
  }
  g.stop_at_eos = !boolean(body, "ignore_eos", false);
  if (chat) {
    const bool lp = boolean(body, "logprobs", false);
    const int64_t top = integer(body, "top_logprobs", 0, 20, 0);
    if (field(body, "top_logprobs") && !lp) throw_api(400, "top_logprobs", "top_logprobs needs logprobs: true");
    r.logprobs = lp ? static_cast<int>(top) : -1;
  } else {
    r.echo = boolean(body, "echo", false);
    if (field(body, "logprobs")) r.logprobs = static_cast<int>(integer(body, "logprobs", 0, 5, 0));
  }
  g.top_logprobs = r.logprobs;
  // echo with logprobs scores the prompt too (its first token has none).
  g.prompt_logprobs = r.echo && r.logprobs >= 0;
  return r;
}

std::string make_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

namespace {

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

// A token's text as it reads mid-sentence ("▁world" as " world", which decode() of the token alone
// gives as "world" for SentencePiece tokenizers); a token that is part of a character (a byte
// token, a split UTF-8 sequence) as decode() gives it, with U+FFFD.
std::string token_text(const Tokenizer& tok, int32_t id) {
  std::string bytes = tok.token_bytes(id);
  if (valid_utf8(bytes)) return bytes;
  const int32_t one[1] = {id};
  return tok.decode(one);
}

json token_bytes(const Tokenizer& tok, int32_t id) {
  json bytes = json::array();
  for (unsigned char b : tok.token_bytes(id)) bytes.push_back(static_cast<int>(b));
  return bytes;
}

// JSON has no -inf: a token with zero probability gets the lowest float, as llama.cpp does.
double finite(double x) { return std::isfinite(x) ? x : std::numeric_limits<float>::lowest(); }

}  // namespace

json completion_logprobs(const std::vector<TokenLogprob>& prompt, const std::vector<TokenLogprob>& lps,
                         const Tokenizer& tok, size_t text_offset0) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < prompt.size() + lps.size(); ++i) {
    if (i == prompt.size()) offset = text_offset0;  // the generated text starts after the echo
    const TokenLogprob& lp = i < prompt.size() ? prompt[i] : lps[i - prompt.size()];
    const std::string t = token_text(tok, lp.id);
    tokens.push_back(t);
    if (!lp.scored) {  // a prompt's first token: OpenAI's null and null
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
    } else {
      token_lps.push_back(finite(lp.logprob));
      json top = json::object();
      for (const auto& [id, l] : lp.top) top[token_text(tok, id)] = finite(l);
      tops.push_back(top);
    }
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    json top = json::array();
    for (const auto& [id, l] : lp.top)
      top.push_back({{"token", token_text(tok, id)}, {"logprob", finite(l)}, {"bytes", token_bytes(tok, id)}});
    content.push_back({{"token", token_text(tok, lp.id)},
                       {"logprob", finite(lp.logprob)},
                       {"bytes", token_bytes(tok, lp.id)},
                       {"top_logprobs", top}});
  }
  return content;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

}  // namespace hybridlm
