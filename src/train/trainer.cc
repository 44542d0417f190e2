#include "train/trainer.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/thread_pool.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "models/config.h"
#include "train/checkpoint.h"
#include "train/dist.h"
#include "train/loss_curve.h"
#include "train/metrics_log.h"
#include "train/optimizer.h"
#include "train/token_data.h"
#include "train/train_model.h"

namespace hybridlm {

namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  check(f.good(), p.string(), ": cannot read");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                               static_cast<long long>(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

// The loss curve next to the checkpoints, replaced whole.
void write_curve(const std::filesystem::path& out, const MetricsLog& log, const std::string& title) {
  std::vector<LossPoint> train, val;
  loss_points(read_metrics(log.path()), train, val);
  const std::filesystem::path tmp = out / ".loss_curve.svg.tmp", path = out / "loss_curve.svg";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << loss_curve_svg(train, val, title);
    check(f.good(), tmp.string(), ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  check(!ec, path.string(), ": ", ec.message());
}

}  // namespace

TrainRunResult run_training(TrainConfig c, const TrainRunOptions& opt, Dist& dist) {
  const bool root = dist.is_root();
  auto say = [&](const std::string& line) {
    if (root && !opt.quiet) std::fprintf(stderr, "%s\n", line.c_str());
  };
  // The model's config and tokenizer.
  const std::filesystem::path tok_path = tokenizer_file(c);
  const Tokenizer tokenizer = Tokenizer::load(tok_path);
  fill_vocab_size(c, tokenizer.vocab_size());
  std::string config_text;
  if (!c.init.empty()) {
    config_text = slurp(c.init / "config.json");
  } else {
    nlohmann::json m = c.model;
    if (!m.contains("bos_token_id") && tokenizer.bos_id()) m["bos_token_id"] = *tokenizer.bos_id();
    if (!m.contains("eos_token_id") && tokenizer.eos_id()) m["eos_token_id"] = *tokenizer.eos_id();
    m["torch_dtype"] = "float32";
    config_text = m.dump(2) + "\n";
  }
  const HybridConfig cfg = parse_config_text(config_text, c.source + ": model");
  check(cfg.family == "hybridlm", c.source, ": model: training needs the hybridlm block-pattern format, not ",
        cfg.family);
  check(cfg.vocab_size >= tokenizer.vocab_size(), c.source, ": model vocab_size ", cfg.vocab_size,
        " is smaller than the tokenizer's ", tokenizer.vocab_size());

  const int world = dist.size(), rank = dist.rank();
  const int rows_global = c.batch.sequences, accum = c.batch.accumulation, seq_len = c.batch.seq_len;
  check(rows_global % world == 0, c.source, ": batch.sequences (", rows_global, ") must be a multiple of the ", world,
        " ranks (each takes an equal share of every micro-batch)");
  const int rows = rows_global / world;

  ThreadPool pool(c.threads > 0 ? c.threads : available_cores());
  TrainModel model(cfg, cpu_kernels(), &pool);
  const TokenFile train_data = TokenFile::open(c.data.train, cfg.vocab_size);
  const BatchSampler sampler(train_data, seq_len, c.seed);
  std::optional<TokenFile> val_data;
  if (const auto vf = validation_file(c)) val_data.emplace(TokenFile::open(*vf, cfg.vocab_size));
  std::optional<EvalWindows> evals;
  if (val_data && c.eval_interval > 0) evals.emplace(*val_data, seq_len, rows, c.eval_batches);

  AdamW adamw(c.adamw);
  for (const TrainTensor& t : model.tensors())
    adamw.add(model.params().subspan(t.offset, t.numel), model.grads().subspan(t.offset, t.numel), t.decay);

  TrainerState state;
  state.seed = c.seed;
  if (opt.resume) {
    const auto dir = latest_checkpoint(c.out);
    check(dir.has_value(), c.out.string(), ": no checkpoint to resume from (run without --resume to start)");
    state = read_trainer_state(*dir);
    check(state.seed == c.seed, *dir / kTrainerStateFile, ": seed ", state.seed, " differs from the config's ",
          c.seed, "; resuming would draw other batches");
    model.load(Checkpoint::open(*dir, false));
    const SafetensorsFile moments = SafetensorsFile::open(*dir / "optimizer.safetensors", false);
    for (size_t i = 0; i < model.tensors().size(); ++i) {
      const TrainTensor& t = model.tensors()[i];
      for (const char* which : {"m.", "v."}) {
        const auto it = moments.tensors().find(which + t.name);
        check(it != moments.tensors().end() && static_cast<size_t>(it->second.numel()) == t.numel,
              *dir / "optimizer.safetensors", ": missing or misshapen ", which, t.name);
        it->second.to_f32(which[0] == 'm' ? adamw.m(i).data() : adamw.v(i).data());
      }
    }
    adamw.set_steps(state.step);
    say("resuming from " + dir->string() + " at step " + std::to_string(state.step));
  } else if (!c.init.empty()) {
    model.load(Checkpoint::open(c.init, false));
  } else {
    model.init(c.seed);
  }
  dist.broadcast(model.params());  // every rank starts from rank 0's parameters

  std::error_code ec;
  std::filesystem::create_directories(c.out, ec);
  check(!ec, c.out.string(), ": cannot create the run directory: ", ec.message());
  std::optional<MetricsLog> metrics;
  if (root)
    metrics.emplace(c.out / "metrics.jsonl", opt.resume ? std::optional<int64_t>(state.step) : std::nullopt);
  const std::string tokenizer_text = slurp(tok_path);

  auto save = [&](const std::string& name) {
    if (!root) return;
    std::vector<TensorToWrite> weights, moments;
    auto bytes = [](std::span<const float> v) {
      return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes());
    };
    std::vector<std::string> names;
    names.reserve(model.tensors().size() * 2);
    for (size_t i = 0; i < model.tensors().size(); ++i) {
      const TrainTensor& t = model.tensors()[i];
      weights.push_back({t.name, DType::F32, t.shape, bytes(model.params().subspan(t.offset, t.numel))});
      moments.push_back({"m." + t.name, DType::F32, t.shape, bytes(adamw.m(i))});
      moments.push_back({"v." + t.name, DType::F32, t.shape, bytes(adamw.v(i))});
    }
    write_checkpoint(c.out, name,
                     {CheckpointFile::text("config.json", config_text),
                      CheckpointFile::safetensors("model.safetensors", weights, {{"format", "pt"}}),
                      CheckpointFile::text("tokenizer.json", tokenizer_text),
                      CheckpointFile::text(kTrainerStateFile, trainer_state_json(state)),
                      CheckpointFile::safetensors("optimizer.safetensors", moments)});
  };

  auto evaluate = [&]() -> double {
    evals->reset();
    std::vector<int32_t> ids(static_cast<size_t>(rows) * (seq_len + 1));
    double sums[2] = {0, 0};  // loss x predictions, predictions
    for (int n; (n = evals->next(ids.data())) > 0;) {
      const double mean = model.forward_backward(ids.data(), n, seq_len + 1, false);
      sums[0] += mean * n * seq_len;
      sums[1] += static_cast<double>(n) * seq_len;
    }
    dist.allreduce_sum(std::span<double>(sums, 2));
    return sums[0] / sums[1];
  };

  const int64_t tokens_per_step = static_cast<int64_t>(rows_global) * accum * seq_len;
  say("training " + cfg.layer_pattern() + ": " + std::to_string(model.n_params()) + " parameters, " +
      std::to_string(c.steps) + " steps of " + std::to_string(tokens_per_step) + " tokens (" +
      std::to_string(rows_global) + " x " + std::to_string(seq_len) + " x " + std::to_string(accum) + "), " +
      std::to_string(world) + (world == 1 ? " process" : " ranks") + ", " + std::to_string(pool.size()) + " threads");
  std::vector<int32_t> ids(static_cast<size_t>(rows) * (seq_len + 1));
  const auto run_start = Clock::now();
  const int64_t first_step = state.step;
  const float grad_scale = 1.0f / static_cast<float>(accum * world);
  TrainRunResult result;
  double window_loss = 0;
  int64_t window_steps = 0;
  auto window_start = Clock::now();
  for (int64_t step = state.step; step < c.steps; ++step) {
    model.zero_grads();
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      // Row r of this rank is global row rank * rows + r: the windows do not depend on the rank count.
      for (int r = 0; r < rows; ++r)
        train_data.copy(sampler.window_start(static_cast<uint64_t>(step), micro, 0, rank * rows + r),
                        static_cast<size_t>(seq_len) + 1, ids.data() + static_cast<size_t>(r) * (seq_len + 1));
      loss += model.forward_backward(ids.data(), rows, seq_len + 1, true, grad_scale);
    }
    dist.allreduce_sum(model.grads());
    double loss_mean = loss;
    dist.allreduce_sum(loss_mean);
    loss_mean /= static_cast<double>(accum) * world;
    check(std::isfinite(loss_mean), "training diverged: the loss at step ", step, " is ", loss_mean,
          " (lower optimizer.lr or set optimizer.grad_clip)");
    std::span<float> all = model.grads();
    const double grad_norm = clip_grad_norm(std::span<const std::span<float>>(&all, 1), c.grad_clip);
    const float lr = lr_at(c.schedule, step);
    adamw.step(lr, &pool);
    state.step = step + 1;
    state.tokens += tokens_per_step;
    state.loss = loss_mean;
    result.steps = state.step;
    result.last_loss = loss_mean;
    window_loss += loss_mean;
    ++window_steps;
    const bool last = state.step == c.steps;
    const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
    if (root && (state.step % c.log_interval == 0 || last)) {
      const double window_s = std::chrono::duration<double>(Clock::now() - window_start).count();
      const double tps = static_cast<double>(tokens_per_step) * window_steps / std::max(window_s, 1e-9);
      const double eta = (c.steps - state.step) * elapsed / static_cast<double>(state.step - first_step);
      char line[256];
      std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  lr %.3g  grad norm %.3g  %.0f tok/s  ETA %s",
                    static_cast<long long>(state.step), static_cast<long long>(c.steps), window_loss / window_steps,
                    lr, grad_norm, tps, fmt_duration(eta).c_str());
      say(line);
      MetricsRow row;
      row.step = state.step;
      row.loss = window_loss / window_steps;
      row.lr = lr;
      row.grad_norm = grad_norm;
      row.tokens_per_s = tps;
      metrics->append(row);
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
    if (evals && (state.step % c.eval_interval == 0 || last)) {
      const double val = evaluate();
      state.val_loss = val;
      result.last_val_loss = val;
      if (root) {
        char line[128];
        std::snprintf(line, sizeof line, "step %lld  validation loss %.4f  perplexity %.2f",
                      static_cast<long long>(state.step), val, std::exp(val));
        say(line);
        MetricsRow row;
        row.step = state.step;
        row.val_loss = val;
        metrics->append(row);
      }
    }
    if (opt.stop_after > 0 && state.step - first_step >= opt.stop_after) return result;
    if ((c.checkpoint_interval > 0 && state.step % c.checkpoint_interval == 0) || last) {
      const double saved_elapsed = state.elapsed_s;
      state.elapsed_s += elapsed;
      save("step-" + std::to_string(state.step));
      if (root) {
        try {
          prune_checkpoints(c.out, c.keep_checkpoints, state.step);
        } catch (const std::exception& e) {  // housekeeping: a warning, the run goes on
          std::fprintf(stderr, "warning: %s\n", e.what());
        }
      }
      state.elapsed_s = saved_elapsed;
      if (root) write_curve(c.out, *metrics, cfg.layer_pattern());
      dist.barrier();
    }
  }
  return result;
}

}  // namespace hybridlm
