#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <random>
#include <thread>

#include "base/error.h"
#include "server/openai.h"

namespace hybridlm {

using json = nlohmann::ordered_json;  // keys in the order written: requests as sent, responses as OpenAI lists them
using Clock = std::chrono::steady_clock;

namespace {

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e));
  if (e.status == 503) {
    res.set_header("Retry-After", "1");
  }
}

// The API key check: its time depends on the key's length only, not on where a guess differs.
bool same_secret(const std::string& given, const std::string& key) {
  if (key.empty()) return false;
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i)
    diff |= static_cast<unsigned char>(i < given.size() ? given[i] : 0) ^ static_cast<unsigned char>(key[i]);
  return diff == 0;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// One choice's answer so far (non-streamed requests).
struct ChoiceOut {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;
};

}  // namespace

struct HttpServer::Impl {
  HttpOptions opt;
  Metrics& metrics;
  httplib::Server svr;
  std::thread thread;
  std::mutex mu;
  std::shared_ptr<ServedModel> model;  // null while loading

  Impl(const HttpOptions& o, Metrics& m) : opt(o), metrics(m) {}

  std::shared_ptr<ServedModel> served() {
    std::lock_guard lock(mu);
    return model;
  }

  void finish(httplib::Response& res, const ApiError& e) {
    send_error(res, e);
    metrics.request_done(e.status);
  }

  void routes();
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
};

void HttpServer::Impl::routes() {
  svr.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  svr.set_payload_max_length(opt.max_body_bytes);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const std::string given = auth.rfind(prefix, 0) == 0 ? auth.substr(prefix.size()) : std::string();
    if (same_secret(given, opt.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    finish(res, api_error(401, "invalid API key: send the server's --api-key as Authorization: Bearer KEY", "",
                          "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib answers itself (no route, an oversized body) get OpenAI's error body too.
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string msg = res.status == 404   ? "no such endpoint: " + req.method + " " + req.path
                          : res.status == 413 ? "the request body is over the server's limit of " +
                                                    std::to_string(opt.max_body_bytes) + " bytes"
                          : res.status == 405 ? "method " + req.method + " is not allowed on " + req.path
                                              : "the request could not be read";
        const ApiError e = api_error(res.status, msg);
        send_json(res, res.status, error_body(e));
        metrics.request_done(res.status);
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    finish(res, api_error(500, what));
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!served()) {
      send_json(res, 503, error_body(api_error(503, "loading the model")));
      return;
    }
    send_json(res, 200, {{"status", "ok"}});
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus(), "text/plain; version=0.0.4");
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    auto m = served();
    json data = json::array();
    if (m) data.push_back({{"id", m->id}, {"object", "model"}, {"created", 0}, {"owned_by", "hybridlm"}});
    send_json(res, 200, {{"object", "list"}, {"data", data}});
    metrics.request_done(200);
  });
  svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    auto m = served();
    const std::string id = req.matches[1];
    if (!m || id != m->id)
      return finish(res, api_error(404, "model " + dump(json(id)) + " does not exist", "model", "model_not_found"));
    send_json(res, 200, {{"id", m->id}, {"object", "model"}, {"created", 0}, {"owned_by", "hybridlm"}});
    metrics.request_done(200);
  });
  svr.Post("/v1/completions",
           [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
  svr.Post("/v1/chat/completions",
           [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto m = served();
  if (!m) return finish(res, api_error(503, "the model is still loading"));
  ApiRequest ar;
  std::vector<int32_t> ids;
  std::string echo_text;
  try {
    ar = parse_request(req.body, chat);
    if (!ar.model.empty() && ar.model != m->id)
      throw_api(404, "model",
                "model " + dump(json(ar.model)) + " does not exist (this server serves " + dump(json(m->id)) + ")",
                "model_not_found");
    const char* prompt_field = chat ? "messages" : "prompt";
    try {
      if (chat) {
        const std::string text = m->render_chat(ar.messages, ar.tools);
        ids = m->tokenizer->encode(text, !m->chat_adds_bos);
      } else if (ar.prompt_ids) {
        ids = *ar.prompt_ids;
        if (ar.echo) echo_text = m->tokenizer->decode(ids);
      } else {
        ids = m->tokenizer->encode(ar.prompt_text);
        echo_text = ar.prompt_text;
      }
    } catch (const Error& e) {
      throw_api(400, prompt_field, e.what());
    }
    if (ids.empty()) throw_api(400, prompt_field, std::string(prompt_field) + " is empty after tokenization");
    const int ctx = m->scheduler->options().context;
    if (static_cast<int64_t>(ids.size()) >= ctx)
      throw_api(400, prompt_field,
                "the prompt is " + std::to_string(ids.size()) + " tokens: it does not fit the context of " +
                    std::to_string(ctx) + " tokens (the server's --ctx-size)",
                "context_length_exceeded");
    const int room = ctx - static_cast<int>(ids.size());
    if (ar.max_tokens && *ar.max_tokens > room)
      throw_api(400, ar.max_tokens_field,
                "the prompt (" + std::to_string(ids.size()) + " tokens) plus max_tokens " +
                    std::to_string(*ar.max_tokens) + " exceeds the context of " + std::to_string(ctx) + " tokens",
                "context_length_exceeded");
    if (ar.gen.n > m->scheduler->slots())
      throw_api(400, "n",
                "n must be at most " + std::to_string(m->scheduler->slots()) +
                    " (the server's --slots: each choice runs in a slot of its own), got " + std::to_string(ar.gen.n));
    ar.gen.max_tokens = ar.max_tokens ? *ar.max_tokens : chat ? room : std::min(16, room);
    if (!ar.seed_given) ar.gen.sampling.seed = std::random_device{}();
    ar.gen.prompt = ids;
    ar.gen.deadline = Clock::now() + std::chrono::seconds(opt.request_timeout_s);
  } catch (const ApiError& e) {
    return finish(res, e);
  }
  std::shared_ptr<GenHandle> handle;
  try {
    handle = m->scheduler->submit(ar.gen);
  } catch (const Error& e) {
    return finish(res, api_error(400, e.what(), chat ? "messages" : "prompt"));
  }
  if (!handle) {
    ApiError e = api_error(503, "the server is busy: every slot is running and the queue is full; retry later", "",
                           "server_is_overloaded");
    return finish(res, e);
  }
  const std::string id = make_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const std::string object = chat ? "chat.completion" : "text_completion";
  const int n = ar.gen.n;
  const Tokenizer& tok = *m->tokenizer;

  if (!ar.stream) {
    std::vector<ChoiceOut> out(static_cast<size_t>(n));
    if (ar.echo)
      for (ChoiceOut& c : out) c.text = echo_text;
    std::string failed;
    int failed_status = 500;
    bool done = false;
    std::vector<TokenLogprob> prompt_lps;  // echo with logprobs
    while (!done) {
      for (GenEvent& ev : handle->wait(std::chrono::milliseconds(500))) {
        ChoiceOut& c = out[static_cast<size_t>(ev.choice)];
        if (ev.kind == GenEvent::Prompt) {  // echoed, so every choice's logprobs start with it
          prompt_lps = std::move(ev.logprobs);
        } else if (ev.kind == GenEvent::Text) {
          c.text += ev.text;
          c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
        } else if (ev.kind == GenEvent::Finish) {
          c.finish_reason = ev.finish_reason;
        } else if (ev.kind == GenEvent::Failed) {
          failed = ev.message;
          failed_status = ev.status;
          done = true;
        } else {
          done = true;
        }
      }
    }
    if (!failed.empty()) {
      finish(res, api_error(failed_status, failed));
      // A request that timed out would time out again: the client should not resend it at once.
      if (failed_status == 503) res.set_header("x-should-retry", "false");
      return;
    }
    json choices = json::array();
    for (int i = 0; i < n; ++i) {
      ChoiceOut& c = out[static_cast<size_t>(i)];
      json lp = nullptr;
      if (ar.logprobs >= 0)
        lp = chat ? json{{"content", chat_logprobs(c.logprobs, tok)}, {"refusal", nullptr}}
                  : completion_logprobs(prompt_lps, c.logprobs, tok, ar.echo ? echo_text.size() : 0);
      if (chat)
        choices.push_back({{"index", i},
                           {"message", {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}}},
                           {"logprobs", lp},
                           {"finish_reason", c.finish_reason}});
      else
        choices.push_back({{"index", i}, {"text", c.text}, {"logprobs", lp}, {"finish_reason", c.finish_reason}});
    }
    send_json(res, 200,
              {{"id", id},
               {"object", object},
               {"created", created},
               {"model", m->id},
               {"choices", choices},
               {"usage", usage_json(handle->usage())}});
    metrics.request_done(200);
    return;
  }

  // Streams: one SSE event per piece of text, a last chunk per choice with its finish_reason, the
  // usage chunk when asked, then [DONE] and the end of the response.
  metrics.request_done(200);
  const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [=](json choices) {
    json c = {
        {"id", id}, {"object", chunk_object}, {"created", created}, {"model", m->id}, {"choices", std::move(choices)}};
    if (ar.include_usage) c["usage"] = nullptr;
    return c;
  };
  auto text_choice = [=](int i, const std::string& text, const std::vector<TokenLogprob>& lps, size_t offset) {
    const Tokenizer& tok = *m->tokenizer;
    json lp = nullptr;
    if (ar.logprobs >= 0)
      lp = chat ? json{{"content", chat_logprobs(lps, tok)}, {"refusal", nullptr}}
                : completion_logprobs({}, lps, tok, offset);
    if (chat) return json{{"index", i}, {"delta", {{"content", text}}}, {"logprobs", lp}, {"finish_reason", nullptr}};
    return json{{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", nullptr}};
  };
  struct StreamState {
    bool started = false, ended = false;
    std::vector<size_t> offsets;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<StreamState>();
  st->offsets.assign(static_cast<size_t>(n), ar.echo ? echo_text.size() : 0);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) -> bool {
        // httplib calls this outside its handler's try: nothing may escape (it would end the process).
        try {
          auto send = [&](const std::string& data) {
            st->last_write = Clock::now();
            const std::string event = "data: " + data + "\n\n";
            return sink.write(event.data(), event.size());
          };
          if (!st->started) {
            st->started = true;
            for (int i = 0; i < n; ++i) {
              json first;
              if (chat)
                first = {{"index", i},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}};
              else if (ar.echo && ar.logprobs < 0)  // with logprobs, the echo waits for the prompt's
                first = {{"index", i}, {"text", echo_text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
              else
                continue;
              if (!send(dump(chunk(json::array({first}))))) return false;
            }
          }
          std::vector<GenEvent> events = handle->wait(std::chrono::milliseconds(250));
          for (GenEvent& ev : events) {
            bool ok = true;
            if (ev.kind == GenEvent::Prompt) {  // the echo of every choice, with the prompt's logprobs
              for (int i = 0; ok && i < n; ++i)
                ok = send(dump(chunk(json::array({text_choice(i, echo_text, ev.logprobs, 0)}))));
            } else if (ev.kind == GenEvent::Text) {
              ok = send(
                  dump(chunk(json::array({text_choice(ev.choice, ev.text, ev.logprobs, st->offsets[ev.choice])}))));
              st->offsets[static_cast<size_t>(ev.choice)] += ev.text.size();
            } else if (ev.kind == GenEvent::Finish) {
              json c = chat ? json{{"index", ev.choice},
                                   {"delta", json::object()},
                                   {"logprobs", nullptr},
                                   {"finish_reason", ev.finish_reason}}
                            : json{{"index", ev.choice},
                                   {"text", ""},
                                   {"logprobs", nullptr},
                                   {"finish_reason", ev.finish_reason}};
              ok = send(dump(chunk(json::array({c}))));
            } else if (ev.kind == GenEvent::Failed) {
              // After the 200 header an error travels in the stream, as OpenAI's client reads it.
              send(dump(error_body(api_error(500, ev.message))));
              send("[DONE]");
              st->ended = true;
              sink.done();
              return true;
            } else {
              if (ar.include_usage) {
                json u = {{"id", id},       {"object", chunk_object},   {"created", created},
                          {"model", m->id}, {"choices", json::array()}, {"usage", usage_json(handle->usage())}};
                ok = send(dump(u));
              }
              ok = ok && send("[DONE]");
              st->ended = true;
              sink.done();
              return ok;
            }
            if (!ok) return false;  // the client went away
          }
          // A comment line now and then: the only way to notice a client that left while queued.
          if (events.empty() && Clock::now() - st->last_write > std::chrono::seconds(2)) {
            st->last_write = Clock::now();
            static const char kPing[] = ": ping\n\n";
            if (!sink.write(kPing, sizeof kPing - 1)) return false;
          }
          return true;
        } catch (const std::exception&) {
          return false;  // the connection closes; the releaser cancels the request
        }
      },
      [handle, st](bool success) {
        if (!success || !st->ended) handle->cancel();
      });
}

HttpServer::HttpServer(const HttpOptions& opt, Metrics& metrics) : impl_(std::make_unique<Impl>(opt, metrics)) {
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& s = *impl_;
  if (s.opt.port == 0) {
    port_ = s.svr.bind_to_any_port(s.opt.host);
    check(port_ > 0, "cannot listen on ", s.opt.host, ": ", std::strerror(errno));
  } else {
    check(s.svr.bind_to_port(s.opt.host, s.opt.port), "cannot listen on ", s.opt.host, ":", s.opt.port,
          " (in use, or not an address of this machine)");
    port_ = s.opt.port;
  }
  s.thread = std::thread([&s] { s.svr.listen_after_bind(); });
}

void HttpServer::attach(ServedModel model) {
  std::lock_guard lock(impl_->mu);
  impl_->model = std::make_shared<ServedModel>(std::move(model));
}

void HttpServer::stop() {
  if (!impl_) return;
  impl_->svr.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace hybridlm
