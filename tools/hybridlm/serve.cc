// `hybridlm serve`: an OpenAI-compatible HTTP server (src/server) over one loaded model, with
// continuous batching, admission by state slots and KV pages, and prefix reuse of SSM state.
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "base/error.h"
#include "models/plan.h"
#include "server/chat_format.h"
#include "server/scheduler.h"
#if HYBRIDLM_HAVE_HTTP
#include "server/http_server.h"
#endif
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"
#include "tools/hybridlm/plan.h"

namespace hybridlm {
namespace {

#if !HYBRIDLM_HAVE_HTTP
struct HttpOptions {  // what the flags fill in; this build cannot serve them
  std::string host = "127.0.0.1", api_key;
  int port = 8080, request_timeout_s = 300;
};
#endif

struct Flags {
  ModelFlags model;
  HttpOptions http;
  SchedulerOptions sched;
  int slots = 4;
  std::string memory;
  double prefix_cache_mb = 256;
  int batch_tokens = 256;
};

#if HYBRIDLM_HAVE_HTTP
// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
double available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// generation_config.json's eos_token_id (an id or a list: instruct models end turns on several).
std::vector<int32_t> generation_eos_ids(const std::string& dir) {
  std::vector<int32_t> ids;
  std::ifstream in(std::filesystem::path(dir) / "generation_config.json");
  if (!in) return ids;
  const nlohmann::json cfg = nlohmann::json::parse(in, nullptr, false);
  if (!cfg.is_object() || !cfg.contains("eos_token_id")) return ids;
  const nlohmann::json& e = cfg["eos_token_id"];
  for (const nlohmann::json& v : e.is_array() ? e : nlohmann::json::array({e}))
    if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX)
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  return ids;
}

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }
#endif

int cmd_serve(Flags& f) {
#if !HYBRIDLM_HAVE_HTTP
  (void)f;
  throw_error(
      "this build of hybridlm has no HTTP server: cpp-httplib was not found when it was built "
      "(scripts/setup.sh installs libcpp-httplib-dev)");
#else
  ModelFlags& mf = f.model;
  check(f.slots >= 1 && f.slots <= 4096, "--slots must be in [1, 4096], got ", f.slots);
  check(mf.ctx_size >= 2, "-c/--ctx-size must be >= 2, got ", mf.ctx_size);
  check(f.prefix_cache_mb >= 0, "--prefix-cache-mb must be >= 0, got ", f.prefix_cache_mb);
  check(f.http.port >= 0 && f.http.port <= 65535, "--port must be in [0, 65535], got ", f.http.port);
  check(f.batch_tokens >= 1, "--batch-tokens must be >= 1, got ", f.batch_tokens);
  EngineOptions eo = mf.options();  // checks -m first
  Tokenizer tok = load_tokenizer(mf.dir);
  ChatFormat chat = ChatFormat::load(mf.dir);

  // The memory plan: state slots, KV pages and the prefix cache, from the config alone.
  const HybridConfig cfg = load_config(mf.dir);
  const WeightDType wdtype = resolve_weight_dtype(mf.dtype, [&] { return stored_dtype(mf.dir); });
  const double weights = static_cast<double>(weight_bytes(cfg, wdtype));
  const CacheFootprint fp = cache_footprint(cache_specs(cfg), eo.state_dtype, eo.kv_dtype);
  const double state = static_cast<double>(fp.state_per_sequence());
  const double page = static_cast<double>(fp.kv_per_token) * eo.block_size;
  const double prefix = f.prefix_cache_mb * 1024 * 1024;
  const int64_t pages_per_ctx = (mf.ctx_size + eo.block_size - 1) / eo.block_size;
  int64_t pages = static_cast<int64_t>(f.slots) * pages_per_ctx;
  if (!f.memory.empty()) {
    const double budget = parse_memory_size(f.memory);
    const double need_min = weights + f.slots * state + (page > 0 ? pages_per_ctx * page : 0) + prefix;
    check(need_min <= budget, "--memory ", f.memory, " is less than the weights (", format_bytes(weights), ") + ",
          f.slots, " slots x ", format_bytes(state), " of state + KV for one --ctx-size ", mf.ctx_size, " sequence (",
          format_bytes(pages_per_ctx * page), ") + --prefix-cache-mb (", format_bytes(prefix),
          "): lower --slots, --ctx-size or --prefix-cache-mb");
    if (page > 0)
      pages = std::min<int64_t>(pages, static_cast<int64_t>((budget - weights - prefix - f.slots * state) / page));
  }
  // Without --memory: the pool holds --slots x --ctx-size; warn when that plan is more than the
  // machine has free (a budget fits the pool to memory instead).
  if (f.memory.empty()) {
    const double planned = weights + f.slots * state + static_cast<double>(pages) * page + prefix;
    if (const double avail = available_memory_bytes(); avail > 0 && planned > avail)
      std::fprintf(stderr,
                   "warning: serve plans %s (weights, %d slots, KV for %d tokens each, prefix cache) but %s is "
                   "available: set --memory, or lower --slots, --ctx-size or --prefix-cache-mb\n",
                   format_bytes(planned).c_str(), f.slots, mf.ctx_size, format_bytes(avail).c_str());
  }
  eo.max_sequences = f.slots;
  eo.context = mf.ctx_size;
  eo.kv_pages = page > 0 ? static_cast<int>(pages) : 0;
  f.sched.context = mf.ctx_size;
  f.sched.step_tokens = f.batch_tokens;
  f.sched.prefix_cache_bytes = static_cast<size_t>(prefix);
  f.sched.stop_ids = generation_eos_ids(mf.dir);
  // Every request, running or queued, holds an HTTP thread while it waits (and a stream for its
  // life): enough of them that a full queue is answered 503, with room for /health and /metrics.
  f.http.http_threads = f.slots + f.sched.max_queue + 16;

  Metrics metrics;
  HttpServer http(f.http, metrics);
  http.start();  // /health answers 503 while the model loads
  std::fprintf(stderr, "serve: listening on http://%s:%d\n", f.http.host.c_str(), http.port());
  Engine engine(mf.dir, eo);
  report_mlock(engine);
  Scheduler scheduler(engine, tok, f.sched, metrics);
  // However this function ends: requests fail first (their HTTP threads stop waiting), then the
  // HTTP threads stop, and only then do the scheduler and the engine they use go.
  struct Stop {
    Scheduler& s;
    HttpServer& h;
    ~Stop() {
      s.shutdown();
      h.stop();
    }
  } stop_in_order{scheduler, http};
  ServedModel served;
  served.id = model_name(mf.dir);
  served.scheduler = &scheduler;
  served.tokenizer = &tok;
  served.render_chat = [&chat](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools) {
    return chat.render(messages, tools);
  };
  served.chat_adds_bos = chat.adds_bos();
  http.attach(std::move(served));
  engine.info(
      strprintf("serve: model %s, %d slots (%s state each), %s of KV pages, prefix cache %s, context %d; chat: %s",
                model_name(mf.dir).c_str(), f.slots, format_bytes(state).c_str(),
                page > 0 ? format_bytes(static_cast<double>(pages) * page).c_str() : "no attention, 0 B",
                format_bytes(prefix).c_str(), mf.ctx_size, chat.description().c_str()));
  std::fprintf(stderr, "serve: ready\n");
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "serve: stopping\n");
  return 0;
#endif
}

}  // namespace

Subcommand add_serve(CLI::App& parent) {
  auto f = std::make_shared<Flags>();
  CLI::App* app =
      parent.add_subcommand("serve", "an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  f->model.add(app, true, true);
  app->add_option("--host", f->http.host, "address to listen on (127.0.0.1: this machine only)")->capture_default_str();
  app->add_option("--port", f->http.port, "port to listen on (0: any free port, printed on stderr)")
      ->capture_default_str();
  app->add_option("--slots", f->slots, "sequences that run at once (state slots); more requests wait in the queue")
      ->capture_default_str();
  app->add_option("--memory", f->memory,
                  "memory budget for weights, state slots, KV pages and the prefix cache (e.g. 8GiB); the KV "
                  "pages are sized to fit it");
  app->add_option("--prefix-cache-mb", f->prefix_cache_mb,
                  "memory for cached prefixes (state snapshots and their KV pages), MiB; 0 = off")
      ->capture_default_str();
  app->add_option("--snapshot-interval", f->sched.snapshot_interval,
                  "keep the state every this many prompt tokens during prefill, for prefix reuse (0 = only at the end "
                  "of each prompt and each request, and where a prompt branches off cached text)")
      ->capture_default_str();
  app->add_option("--max-queue", f->sched.max_queue, "requests that may wait for a slot; beyond it the answer is 503")
      ->capture_default_str();
  app->add_option("--batch-tokens", f->batch_tokens,
                  "tokens per engine step: one per running sequence, then prompt chunks (chunked prefill)")
      ->capture_default_str();
  app->add_option("--api-key", f->http.api_key, "require Authorization: Bearer KEY on every endpoint but /health");
  app->add_option("--timeout", f->http.request_timeout_s, "seconds a request may wait and run before it ends")
      ->capture_default_str();
  return {app, [f] { return cmd_serve(*f); }};
}

}  // namespace hybridlm
