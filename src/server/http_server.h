// The HTTP side of `hybridlm serve` (cpp-httplib): OpenAI's endpoints over the scheduler, Server-Sent
// Events for streams, an API key, a body size limit, and every error as OpenAI's JSON error object.
// GET /health answers 503 until attach() hands it a loaded model, then 200.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/tokenizer.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace hybridlm {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (port() tells which)
  std::string api_key;  // "" = none
  size_t max_body_bytes = 8u << 20;
  int request_timeout_s = 300;  // a request still queued or running after this ends (under the
                                // openai client's 600 s, after which it would resend it)
  int http_threads = 64;        // connections served at once (each stream holds one)
};

// Messages (checked by parse_request) and tools (null when absent) to the prompt text.
using ChatRenderer =
    std::function<std::string(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools)>;

struct ServedModel {
  std::string id;  // what /v1/models lists and responses name
  Scheduler* scheduler = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ChatRenderer render_chat;
  bool chat_adds_bos = false;  // the rendered chat text already starts with BOS (no post-processor BOS)
};

class HttpServer {
 public:
  HttpServer(const HttpOptions& opt, Metrics& metrics);
  ~HttpServer();
  // Binds (an Error naming host:port when it cannot) and serves on a thread of its own.
  void start();
  int port() const { return port_; }
  // The model is loaded: requests are served from now on.
  void attach(ServedModel model);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace hybridlm
