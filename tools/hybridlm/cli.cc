#include "tools/hybridlm/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "base/thread_pool.h"
#include "models/plan.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {

std::vector<int32_t> parse_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  std::string s = text;
  const size_t first = s.find_first_not_of(" \t\n"), last = s.find_last_not_of(" \t\n");
  if (first != std::string::npos && s[first] == '[' && s[last] == ']') {  // a JSON array
    s = s.substr(first + 1, last - first - 1);
    if (s.find_first_not_of(" \t\n") == std::string::npos) return ids;
  }
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string item = s.substr(at, comma - at);
    const size_t b = item.find_first_not_of(" \t\n"), e = item.find_last_not_of(" \t\n");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    bool ok = !item.empty() && item.size() <= 10 &&
              item.find_first_not_of("0123456789") == std::string::npos;
    const long long v = ok ? std::stoll(item) : -1;
    ok = ok && v <= INT32_MAX;
    if (!ok)
      throw Error(std::string(flag) + ": '" + item + "' is not a token id (expected comma-separated integers >= 0)");
    ids.push_back(static_cast<int32_t>(v));
    at = comma + 1;
  }
  return ids;
}

std::string model_dir_of(std::string path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return path;
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? std::string(".") : parent;
}

std::string model_name(const std::string& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

void check_model_path(const std::string& dir) {
  std::error_code ec;
  if (dir == default_model_dir())
    check(std::filesystem::exists(std::filesystem::path(dir) / "config.json", ec), "no -m given, and the default model ",
          dir, " is missing (a clone of the repository has it; or give -m DIR)");
  check(std::filesystem::exists(dir, ec), "-m ", dir, ": no such file or directory");
}

std::string lower_dtype(DType t) {
  std::string s(dtype_name(t));
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

namespace {

// What a model-loading command says on stderr while and after loading (ModelFlags::options
// wires it into EngineOptions; --quiet leaves it out).
// - Progress, "loading weights: 45% (1.20 GiB of 2.67 GiB, 1.3 s)", once loading has taken 1 s,
//   from the start for weights of 1 GiB or more, and always with --verbose; a few times a second,
//   rewritten in place (\r) only when stderr is a terminal, else one line each, once a second.
// - One summary line when the engine is ready (load_summary).
// - With --verbose, a line per checkpoint tensor: its name, dtype, shape and how memory holds it.
class LoadReport {
 public:
  LoadReport(bool verbose, std::string requested)
      : verbose_(verbose), in_place_(!verbose && isatty(STDERR_FILENO)), requested_(std::move(requested)) {}
  // A load that failed mid-way: the error line starts on a line of its own.
  ~LoadReport() {
    if (open_line_) std::fputc('\n', stderr);
  }
  LoadReport(const LoadReport&) = delete;
  LoadReport& operator=(const LoadReport&) = delete;

  void tensor(const TensorLoaded& t) {
    if (restart_) {  // the first tensor of another load with these options (bench: one per -t)
      restart_ = false;
      start_ = clock::now();
      last_ = 0;
      shown_ = false;
      file_.clear();
    }
    const double now = std::chrono::duration<double>(clock::now() - start_).count();
    if (verbose_) {
      if (t.tensor.file != file_) std::fprintf(stderr, "reading %s\n", (file_ = t.tensor.file).c_str());
      std::string shape;
      for (int64_t d : t.tensor.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      std::fprintf(stderr, "  %s: %s (%s) -> %s, %s\n", t.tensor.name.c_str(), lower_dtype(t.tensor.dtype).c_str(),
                   shape.c_str(), t.held.c_str(), format_bytes(static_cast<double>(t.bytes_held)).c_str());
    }
    constexpr double kLarge = 1024.0 * 1024 * 1024;
    const bool done = t.bytes_read >= t.bytes_total;
    if (!(verbose_ || now >= 1.0 || static_cast<double>(t.bytes_total) >= kLarge)) return;
    if (!done && shown_ && now - last_ < (in_place_ ? 0.25 : 1.0)) return;
    last_ = now;
    shown_ = true;
    const double total = static_cast<double>(t.bytes_total);
    std::fprintf(stderr, "%sloading weights: %3.0f%% (%s of %s, %.1f s)%s", in_place_ ? "\r" : "",
                 total > 0 ? 100.0 * static_cast<double>(t.bytes_read) / total : 100.0,
                 format_bytes(static_cast<double>(t.bytes_read)).c_str(), format_bytes(total).c_str(), now,
                 in_place_ && !done ? "" : "\n");
    open_line_ = in_place_ && !done;
  }

  // "loaded jamba: 6.73 M parameters, weights bf16 (checkpoint bf16, --dtype auto), state f32,
  // KV bf16, cpu path avx2, 2 threads, 0.05 s"
  void ready(const Engine& e, double seconds) {
    if (open_line_) std::fputc('\n', stderr);  // the loader skipped a tensor: end the \r line
    open_line_ = false;
    restart_ = true;
    const Model& m = e.model();
    const HybridCache& c = e.cache();
    const double p = static_cast<double>(m.param_count());
    char params[32];
    std::snprintf(params, sizeof params, p >= 1e9 ? "%.2f B" : "%.2f M", p >= 1e9 ? p / 1e9 : p / 1e6);
    const std::string path = std::string(e.kernels().name) == "cpu" ? std::string("cpu path ") + cpu::active_path()
                                                                     : std::string(e.kernels().name) + " kernels";
    std::fprintf(stderr, "loaded %s: %s parameters, weights %s (checkpoint %s%s), state %s, KV %s, %s, %d thread%s, %.2f s\n",
                 m.config().family.c_str(), params, weight_dtype_name(m.weight_dtype()),
                 lower_dtype(m.stored_dtype()).c_str(), requested_ == "auto" ? ", --dtype auto" : "",
                 c.has_state() ? cache_dtype_name(c.state_dtype()) : "none",
                 c.has_kv() ? cache_dtype_name(c.kv_dtype()) : "none", path.c_str(), e.threads(),
                 e.threads() == 1 ? "" : "s", seconds);
    if (verbose_)
      std::fprintf(stderr, "weights: %s in memory, %s of it used in place from the mapped files\n",
                   format_bytes(static_cast<double>(m.weight_bytes())).c_str(),
                   format_bytes(static_cast<double>(m.mapped_bytes())).c_str());
  }

 private:
  using clock = std::chrono::steady_clock;
  const bool verbose_, in_place_;
  const std::string requested_;  // the --dtype flag
  clock::time_point start_ = clock::now();
  double last_ = 0;
  bool shown_ = false, open_line_ = false, restart_ = false;
  std::string file_;
};

}  // namespace

std::string default_model_dir() {
  if (const char* env = std::getenv("HYBRIDLM_DEFAULT_MODEL"); env && *env) return env;
  return HYBRIDLM_DEFAULT_MODEL_DIR;
}

void ModelFlags::add(CLI::App* app, bool with_threads, bool default_model) {
  // A file inside the model directory (model.safetensors, config.json) stands for the directory.
  CLI::Option* m =
      app->add_option("-m,--model", dir,
                      default_model ? "model directory (config.json, *.safetensors, tokenizer.json), or a file in "
                                      "it; default: the shipped model, " + default_model_dir()
                                    : "model directory (config.json, *.safetensors, tokenizer.json), or a file in it")
          ->transform(model_dir_of, "", "");
  if (default_model) dir = default_model_dir();
  else m->required();
  app->add_option("--dtype", dtype,
                  "weights in memory: auto (the checkpoint's: bf16 stays bf16, f16 loads as bf16, f32 as f32), "
                  "f32, bf16, q8_0 or q4_0 (int8 or 4-bit blocks of 32, converted at load)")
      ->capture_default_str();
  app->add_option("--mamba2-norm", mamba2_norm,
                  "Mamba-2 gated norm: grouped (mamba_ssm, llama.cpp) or full (transformers torch path)")
      ->capture_default_str();
  if (with_threads)
    app->add_option("-t,--threads", threads,
                    "threads; 0 = all " + std::to_string(available_cores()) + " CPUs this process may use")
        ->capture_default_str();
  app->add_flag("--no-mmap", no_mmap, "read weights into memory instead of mapping the files");
  app->add_flag("--mlock", mlock, "lock the weights in RAM (no paging out; may need a higher RLIMIT_MEMLOCK)");
  app->add_option("-c,--ctx-size", ctx_size,
                  "context in tokens: what the KV cache holds per sequence (attention layers) and generate -n -1's "
                  "limit; perplexity's window")
      ->capture_default_str();
  app->add_option("--state-dtype", state_dtype, "recurrent state storage: f32, bf16 or f16 (half the memory)")
      ->capture_default_str();
  app->add_option("--kv-dtype", kv_dtype,
                  "attention KV cache storage: f32, bf16 or f16 (bf16/f16: half the memory; f32: exact)")
      ->capture_default_str();
  app->add_option("--kernels", kernels, "cpu (optimised) or ref (the scalar reference kernels, slow: for checking)")
      ->capture_default_str();
  app->add_flag("--quiet", quiet, "no load summary, progress or cache lines on stderr (errors and warnings still)");
  app->add_flag("--verbose", verbose, "also a line per tensor loaded, and load progress however fast")
      ->excludes(app->get_option("--quiet"));
}

EngineOptions ModelFlags::options() const {
  check_model_path(dir);
  EngineOptions o;
  o.load.dtype = resolve_weight_dtype(dtype, [&] { return stored_dtype(dir); });
  check(mamba2_norm == "grouped" || mamba2_norm == "full", "--mamba2-norm ", mamba2_norm, ": use grouped or full");
  o.load.mamba2_norm = mamba2_norm == "full" ? NormGrouping::Full : NormGrouping::Grouped;
  o.load.use_mmap = !no_mmap;
  o.mlock = mlock;
  check(threads >= 0 && threads <= 1024, "--threads ", threads, ": must be in [0, 1024]");
  if (const int cores = available_cores(); threads > cores)
    std::fprintf(stderr, "warning: --threads %d is more than the %d CPUs this process may use: threads will take "
                 "turns (slower); 0 uses all\n", threads, cores);
  o.threads = threads;
  o.max_sequences = 1;
  check(ctx_size > 0 && ctx_size <= (1 << 24), "--ctx-size ", ctx_size, ": must be in [1, 2^24]");
  o.context = ctx_size;
  o.state_dtype = parse_cache_dtype("--state-dtype", state_dtype);
  o.kv_dtype = parse_cache_dtype("--kv-dtype", kv_dtype);
  try {
    o.kernels = &kernels_by_name(kernels);
  } catch (const Error& e) {
    throw Error(std::string("--") + e.what());
  }
  if (!quiet) {
    auto report = std::make_shared<LoadReport>(verbose, dtype);
    o.load.on_tensor = [report](const TensorLoaded& t) { report->tensor(t); };
    o.on_ready = [report](const Engine& e, double seconds) { report->ready(e, seconds); };
    o.info = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
  return o;
}

void report_mlock(const Engine& e) {
  if (!e.mlock_error().empty())
    std::fprintf(stderr, "warning: --mlock failed (%s): weights may be paged out (raise RLIMIT_MEMLOCK, ulimit -l)\n",
                 e.mlock_error().c_str());
}

void report_cache(Engine& e) {
  const HybridCache& c = e.cache();
  std::string line;
  if (c.has_state())
    line = std::string("state ") + cache_dtype_name(c.state_dtype()) + ", " +
           format_bytes(static_cast<double>(c.state_bytes_per_sequence())) + " per sequence";
  if (c.has_kv())
    line += std::string(line.empty() ? "" : "; ") + "KV " + cache_dtype_name(c.kv_dtype()) + ", " +
            format_bytes(static_cast<double>(c.kv_bytes_per_token())) + " per token";
  e.info("cache: " + (line.empty() ? std::string("none") : line));
}

bool has_tokenizer(const std::string& dir) {
  const std::filesystem::path d(dir);
  return std::filesystem::exists(d / "tokenizer.json") || std::filesystem::exists(d / "tokenizer.model");
}

Tokenizer load_tokenizer(const std::string& dir) {
  check_model_path(dir);
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  check(has_tokenizer(dir), p.string(),
        ": not found, nor tokenizer.model (this command needs the model's tokenizer)");
  return Tokenizer::load(dir);
}

double token_logprob(const float* logits, int vocab, int32_t id) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - mx);
  return static_cast<double>(logits[id]) - mx - std::log(sum);
}

namespace {
constexpr double kMaxLogitBytes = 4.0 * (1ull << 30);
}  // namespace

void check_logits_fit(size_t tokens, int vocab, const std::string& what) {
  const double bytes = static_cast<double>(tokens) * vocab * sizeof(float);
  check(bytes <= kMaxLogitBytes, what, ": ", tokens, " tokens x ", vocab, " vocab = ", format_bytes(bytes),
      " of logits, over the ", format_bytes(kMaxLogitBytes), " limit; use fewer tokens");
}

// The offset of the first byte that does not belong to well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or npos.
static size_t invalid_utf8_offset(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return i;
    const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
    // The second byte's range depends on the first (E0: A0..BF, ED: 80..9F, F0: 90..BF, F4: 80..8F).
    const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (c1 < lo || c1 > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

std::string read_text_file(const std::string& file, uint64_t max_bytes, const char* purpose) {
  std::error_code ec;
  check(std::filesystem::exists(file, ec), file, ": no such file");
  check(!std::filesystem::is_directory(file, ec), file, ": is a directory");
  std::ifstream in(file, std::ios::binary);
  check(static_cast<bool>(in), file, ": cannot open");
  const auto fsize = std::filesystem::file_size(file, ec);
  check(!ec && fsize <= max_bytes, file, ": ",
        (ec ? ec.message()
            : format_bytes(static_cast<double>(fsize)) + ", over the " + format_bytes(static_cast<double>(max_bytes)) +
                  " limit for " + purpose));
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  const size_t nul = s.find('\0');
  check(nul == std::string::npos, file, ": not a text file (a NUL byte at offset ", nul, ")");
  const size_t bad = invalid_utf8_offset(s);
  check(bad == std::string::npos, file, ": not a text file (invalid UTF-8 at byte offset ", bad, ")");
  return s;
}

}  // namespace hybridlm
