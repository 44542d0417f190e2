#include "train/train_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "base/error.h"
#include "io/safetensors.h"
#include "models/blocks/mamba2.h"
#include "models/blocks/mixer.h"
#include "models/model.h"
#include "models/weights.h"

namespace hybridlm {

namespace {

// The SSD chunk of training: the cap inference uses on CPU (exact for any value; see mamba2.cc).
constexpr int kTrainSsdChunk = 64;
// The kernels' scratch is sized from the mixers' declared chunk, min(chunk_size, kCpuSsdChunk).
static_assert(kTrainSsdChunk <= kCpuSsdChunk);

WeightView view(const float* w, int rows, int cols) { return {DType::F32, w, rows, cols}; }

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// d softplus(x) / dx as the softplus kernel computes it (x > 20 passes through).
float softplus_grad(float x) { return x > 20.0f ? 1.0f : sigmoid(x); }

void add_into(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

void add_to(const float* a, const float* b, size_t n, float* dst) {  // dst = a + b
  for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

template <class V>
float* sized(V& v, size_t n) {
  v.resize(n);
  return v.data();
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

// A parameter and its gradient.
struct Param {
  float* p = nullptr;
  float* g = nullptr;
  explicit operator bool() const { return p != nullptr; }
};

struct TrainModel::Layer {
  const BlockSpec* spec = nullptr;
  Param mixer_norm, ffn_norm;
  // Mamba-1 / Mamba-2 (in_proj .. out_proj), attention (q .. k_norm), MLP (gate, up, down).
  Param in_proj, in_bias, conv_w, conv_b, x_proj, dt_proj, dt_bias, A_log, D, norm, out_proj, out_bias;
  Param z_bias;  // m2d without projection biases
  Param q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm;
  Param gate, up, down;
  // Saved activations: rows (B * T) of each.
  std::vector<float> h_in, u, h_mid, u2;              // block input, mixer input, after the mixer, MLP input
  std::vector<float> proj, conv, dbc, dtl, dt_raw, dt, y, g, A;  // SSM mixers (m2d: dt the log-decay)
  std::vector<float> zg;                                         // m2d: z + z_bias
  std::vector<float> q_pre, k_pre, qa, ka, va, att;   // attention (q, k after norm and RoPE)
  std::vector<float> a, b, m;                         // MLP (gated: a = [gate | up] rows)
};

TrainModel::TrainModel(HybridConfig cfg, const KernelTable& ops, ThreadPool* pool)
    : cfg_(std::move(cfg)), ctx_{pool, &ops, &scratch_} {
  check_supported();
  build_tensors();
}

TrainModel::~TrainModel() {
  for (Layer* l : layers_) delete l;
}

void TrainModel::check_supported() const {
  const HybridConfig& c = cfg_;
  auto refuse = [&](const std::string& what) {
    throw Error("training: " + what + " is not supported (the trainer computes the hybridlm block-pattern format)");
  };
  if (c.embedding_multiplier != 1.0f || c.residual_multiplier != 1.0f || c.logits_multiplier != 1.0f)
    refuse(c.family + "'s embedding/residual/logits multipliers");
  if (c.norm_offset != 0.0f) refuse("zero-centred (1 + w) norms (" + c.family + ")");
  for (const BlockSpec& b : c.blocks) {
    if (b.shared_block >= 0) refuse("a shared attention block (" + c.family + ")");
    if (b.ffn.kind == FfnKind::Moe) refuse("a mixture of experts");
    if (b.ffn.kind == FfnKind::Mlp) {
      const MlpSpec& m = b.ffn.mlp;
      if (m.fused || m.bias || m.gate_scale != 1.0f || m.down_scale != 1.0f)
        refuse("an MLP with fused projections, biases or multipliers");
    }
    switch (b.mixer) {
      case MixerKind::Mamba1:
        if (b.m1.dt_bc_rms) refuse("Mamba-1 with dt/B/C norms (falcon_mamba, jamba)");
        if (b.m1.n_heads != 1 || b.m1.head_tensors || b.m1.in_proj_interleaved)
          refuse("multi-head Mamba-1 (zamba)");
        break;
      case MixerKind::Mamba2: {
        const Mamba2Spec& s = b.m2;
        if (!s.gate_norm || s.norm_before_gate) refuse("a Mamba-2 gate other than norm(y * silu(z))");
        if (s.in_scale != 1.0f || s.out_scale != 1.0f ||
            std::any_of(std::begin(s.mup), std::end(s.mup), [](float m) { return m != 1.0f; }))
          refuse("Mamba-2 multipliers (Falcon-H1)");
        break;
      }
      case MixerKind::Attention: {
        const AttentionSpec& s = b.attn;
        if (s.in_scale != 1.0f || s.k_scale != 1.0f || s.out_scale != 1.0f) refuse("attention multipliers");
        if (s.output_gate || s.qk_norm_offset != 0.0f) refuse("gated attention (" + c.family + ")");
        break;
      }
      case MixerKind::Mamba2Discrete: break;
      default:
        refuse(std::string("the mixer '") + block_label(b) + "'");
    }
  }
}

void TrainModel::build_tensors() {
  size_t offset = 0;
  for (const TensorEntry& e : Model::tensors(cfg_)) {
    TrainTensor t;
    t.name = e.name;
    t.shape = e.shape;
    t.numel = static_cast<size_t>(e.numel());
    t.offset = offset;
    // Decay the matrices (and conv taps); not norms, biases, D, dt_bias (all 1-D) nor A_log.
    t.decay = e.shape.size() >= 2 && !ends_with(e.name, "A_log");
    offset += t.numel;
    tensors_.push_back(std::move(t));
  }
  params_.assign(offset, 0.0f);
  grads_.assign(offset, 0.0f);

  auto get = [&](const std::string& name) -> Param {
    for (TrainTensor& t : tensors_)
      if (t.name == name) return {params_.data() + t.offset, grads_.data() + t.offset};
    return {};
  };
  for (int i = 0; i < cfg_.n_layers(); ++i) {
    const BlockSpec& b = cfg_.blocks[i];
    auto* L = new Layer;
    layers_.push_back(L);
    L->spec = &b;
    L->mixer_norm = get(b.names.mixer_norm);
    const std::string& p = b.names.mixer;
    L->in_proj = get(p + "in_proj.weight");
    L->in_bias = get(p + "in_proj.bias");
    L->conv_w = get(p + "conv1d.weight");
    L->conv_b = get(p + "conv1d.bias");
    L->x_proj = get(p + "x_proj.weight");
    L->dt_proj = get(p + "dt_proj.weight");
    L->dt_bias = get(b.mixer == MixerKind::Mamba1 ? p + "dt_proj.bias" : p + "dt_bias");
    L->A_log = get(p + "A_log");
    L->D = get(p + "D");
    L->norm = get(p + "norm.weight");
    L->out_proj = get(p + "out_proj.weight");
    L->out_bias = get(p + "out_proj.bias");
    L->z_bias = get(p + "z_bias");
    L->q = get(p + "q_proj.weight");
    L->k = get(p + "k_proj.weight");
    L->v = get(p + "v_proj.weight");
    L->o = get(p + b.attn.o_name + ".weight");
    L->q_bias = get(p + "q_proj.bias");
    L->k_bias = get(p + "k_proj.bias");
    L->v_bias = get(p + "v_proj.bias");
    L->o_bias = get(p + b.attn.o_name + ".bias");
    L->q_norm = get(p + b.attn.q_norm_name + ".weight");
    L->k_norm = get(p + b.attn.k_norm_name + ".weight");
    if (b.ffn.kind == FfnKind::Mlp) {
      L->ffn_norm = get(b.names.ffn_norm);
      L->gate = get(b.names.ffn + b.ffn.mlp.gate + ".weight");
      L->up = get(b.names.ffn + b.ffn.mlp.up + ".weight");
      L->down = get(b.names.ffn + b.ffn.mlp.down + ".weight");
      if (b.ffn.mlp.gated)  // mlp_forward's one product of both (Model::tensors lists gate, then up)
        check(L->up.p == L->gate.p + static_cast<size_t>(b.ffn.mlp.d_ff) * cfg_.d_model,
              "training: layer ", i, "'s MLP gate and up weights are not adjacent");
    }
  }
}

TrainTensor& TrainModel::find(const std::string& name) {
  for (TrainTensor& t : tensors_)
    if (t.name == name) return t;
  throw Error("training: the model has no tensor '" + name + "'");
}

std::span<float> TrainModel::param(const std::string& name) {
  const TrainTensor& t = find(name);
  return {params_.data() + t.offset, t.numel};
}

std::span<float> TrainModel::grad(const std::string& name) {
  const TrainTensor& t = find(name);
  return {grads_.data() + t.offset, t.numel};
}

void TrainModel::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void TrainModel::load(const Checkpoint& ckpt) {
  const WeightReader reader(ckpt, WeightDType::F32);
  for (const TrainTensor& t : tensors_) {
    const std::vector<float> v = reader.vector(t.name, t.shape);
    std::copy(v.begin(), v.end(), params_.begin() + static_cast<std::ptrdiff_t>(t.offset));
  }
}

void TrainModel::init(uint64_t seed) {
  // As mamba_ssm initialises MixerModel and its mixers (and torch its Linear / Conv1d defaults):
  // - linear weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases zero; conv taps and conv bias
  //   U(+-1/sqrt(K)); the embedding N(0, 0.02); norm weights 1;
  // - the projections that write the residual stream (out_proj, o_proj, down_proj) divided by
  //   sqrt(n_residuals_per_layer * n_layers) (GPT-2's prenorm-residual rescaling);
  // - dt bias = softplus^-1(dt), dt = exp(U(log 1e-3, log 1e-1)) floored at 1e-4; Mamba-1's
  //   dt_proj weight U(+-dt_rank^-0.5); A_log = log(1..N) per channel (Mamba-1) or log(U(1, 16))
  //   per head (Mamba-2); D = 1.
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto uniform = [&](float* p, size_t n, double bound) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>((2.0 * unit(rng) - 1.0) * bound);
  };
  const bool any_mlp = std::any_of(cfg_.blocks.begin(), cfg_.blocks.end(),
                                   [](const BlockSpec& b) { return b.ffn.kind == FfnKind::Mlp; });
  const double residual_scale = 1.0 / std::sqrt((any_mlp ? 2.0 : 1.0) * cfg_.n_layers());
  auto dt_bias = [&](float* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const double dt = std::max(std::exp(std::log(1e-3) + unit(rng) * (std::log(1e-1) - std::log(1e-3))), 1e-4);
      p[i] = static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus^-1(dt) = log(exp(dt) - 1)
    }
  };
  for (const TrainTensor& t : tensors_) {
    float* p = params_.data() + t.offset;
    const std::string& n = t.name;
    if (t.shape.size() == 1) {  // norms 1, D 1, biases 0, dt bias below
      float fill = 0.0f;
      if (ends_with(n, "norm.weight") || ends_with(n, ".D")) fill = 1.0f;
      std::fill(p, p + t.numel, fill);
      if (ends_with(n, "dt_bias") || ends_with(n, "dt_proj.bias")) dt_bias(p, t.numel);
      if (ends_with(n, "conv1d.bias")) uniform(p, t.numel, 1.0);  // fan_in = K * 1; replaced below
      if (ends_with(n, "A_log"))  // Mamba-2: one per head
        for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<float>(std::log(1.0 + 15.0 * unit(rng)));
      continue;
    }
    if (ends_with(n, "A_log")) {  // Mamba-1: (I, N) rows of log(1..N)
      const int64_t N = t.shape[1];
      for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<float>(std::log(static_cast<double>(i % N + 1)));
      continue;
    }
    if (ends_with(n, "embed_tokens.weight")) {
      std::normal_distribution<double> nd(0.0, 0.02);
      for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<float>(nd(rng));
      continue;
    }
    const int64_t fan_in = t.shape.back() * (t.shape.size() == 3 ? t.shape[1] : 1);
    double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    if (ends_with(n, "dt_proj.weight")) bound = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
    if (ends_with(n, "out_proj.weight") || ends_with(n, "o_proj.weight") || ends_with(n, "down_proj.weight"))
      bound *= residual_scale;
    uniform(p, t.numel, bound);
  }
  // Conv biases share the taps' fan-in K.
  for (const TrainTensor& t : tensors_)
    if (ends_with(t.name, "conv1d.bias")) {
      const TrainTensor& w = find(t.name.substr(0, t.name.size() - 4) + "weight");
      const double bound = 1.0 / std::sqrt(static_cast<double>(w.shape.back()));
      for (size_t i = 0; i < t.numel; ++i) params_[t.offset + i] *= static_cast<float>(bound);
    }
}

namespace {

// Forward and backward of one mixer or MLP over M = B * T rows (B sequences of T tokens, each
// from a zero state). u: (M, H) the normalised input; out / du: (M, H).
// The workspace slot of a forward's zeroed starting state (the backward passes use 0 .. 6).
constexpr size_t kForwardState = 8;

struct Pass {
  const KernelContext& ctx;
  int B, T, H;
  TrainWorkspace& ws;  // the backward passes' temporaries, kept between steps
  size_t M() const { return static_cast<size_t>(B) * T; }
};

// The layer's causal conv (conv1d weight and bias) over C channels of each of the B rows, from a
// zero state: in: (M, ld) -> out: (M, C); and its backward, dout -> din (same stride as in) and
// the conv's weight and bias gradients.
void conv_rows(const Pass& P, const TrainModel::Layer& L, const float* in, int ld, int C, int K, bool silu,
               float* out) {
  const size_t T = P.T, n = static_cast<size_t>(K - 1) * C;
  float* state = P.ws.get(kForwardState, n);
  for (int b = 0; b < P.B; ++b) {
    std::fill(state, state + n, 0.0f);
    P.ctx.ops->conv1d_causal(P.ctx, in + b * T * ld, ld, L.conv_w.p, L.conv_b.p, state, P.T, C, K, silu,
                             out + b * T * C);
  }
}

void conv_rows_backward(const Pass& P, const TrainModel::Layer& L, const float* in, int ld, int C, int K, bool silu,
                        const float* dout, float* din) {
  const size_t T = P.T;
  const std::vector<float> zeros(static_cast<size_t>(K - 1) * C, 0.0f);
  for (int b = 0; b < P.B; ++b)
    P.ctx.ops->conv1d_causal_backward(P.ctx, in + b * T * ld, ld, L.conv_w.p, L.conv_b.p, zeros.data(), P.T, C, K,
                                      silu, dout + b * T * C, din + b * T * ld, ld, L.conv_w.g, L.conv_b.g, nullptr);
}

void mamba1_forward(const Pass& P, TrainModel::Layer& L, const float* u, float* out) {
  const Mamba1Spec& s = L.spec->m1;
  const KernelContext& ctx = P.ctx;
  const int I = s.d_inner, N = s.d_state, K = s.d_conv, R = s.dt_rank, W1 = R + 2 * N;
  const size_t M = P.M(), T = P.T;
  float* proj = sized(L.proj, M * 2 * I);
  ctx.ops->matmul_train(ctx, view(L.in_proj.p, 2 * I, P.H), L.in_bias.p, u, static_cast<int>(M), proj);
  float* conv = sized(L.conv, M * I);
  conv_rows(P, L, proj, 2 * I, I, K, true, conv);
  float* dbc = sized(L.dbc, M * W1);
  ctx.ops->matmul_train(ctx, view(L.x_proj.p, W1, I), nullptr, conv, static_cast<int>(M), dbc);
  float* dtl = sized(L.dtl, M * R);
  for (size_t t = 0; t < M; ++t) std::copy(dbc + t * W1, dbc + t * W1 + R, dtl + t * R);
  float* dt_raw = sized(L.dt_raw, M * I);
  ctx.ops->matmul_train(ctx, view(L.dt_proj.p, I, R), L.dt_bias.p, dtl, static_cast<int>(M), dt_raw);
  float* dt = sized(L.dt, M * I);
  std::copy(dt_raw, dt_raw + M * I, dt);
  ctx.ops->softplus(ctx, dt, M * I);
  float* A = sized(L.A, static_cast<size_t>(I) * N);
  for (size_t i = 0; i < L.A.size(); ++i) A[i] = -std::exp(L.A_log.p[i]);
  float* y = sized(L.y, M * I);
  float* h = P.ws.get(kForwardState, static_cast<size_t>(I) * N);
  for (int b = 0; b < P.B; ++b) {
    std::fill(h, h + static_cast<size_t>(I) * N, 0.0f);
    const float* bc = dbc + b * T * W1;
    ctx.ops->mamba1_scan(ctx, conv + b * T * I, I, dt + b * T * I, A, bc + R, bc + R + N, W1, L.D.p,
                         proj + b * T * 2 * I + I, 2 * I, h, P.T, I, N, y + b * T * I);
  }
  ctx.ops->matmul_train(ctx, view(L.out_proj.p, P.H, I), L.out_bias.p, y, static_cast<int>(M), out);
}

void mamba1_backward(const Pass& P, TrainModel::Layer& L, const float* u, const float* dout, float* du) {
  const Mamba1Spec& s = L.spec->m1;
  const KernelContext& ctx = P.ctx;
  const int I = s.d_inner, N = s.d_state, K = s.d_conv, R = s.dt_rank, W1 = R + 2 * N;
  const size_t M = P.M(), T = P.T;
  const int Mi = static_cast<int>(M);
  // Every kernel writes these whole (ops.inc), so they are not cleared; dA accumulates.
  float* dy = P.ws.get(0, M * I);
  float* dconv = P.ws.get(1, M * I);
  float* ddt = P.ws.get(2, M * I);
  float* ddbc = P.ws.get(3, M * W1);
  float* dproj = P.ws.get(4, M * 2 * I);
  std::vector<float> dA(L.A.size(), 0.0f);
  ctx.ops->matmul_backward(ctx, view(L.out_proj.p, P.H, I), L.y.data(), dout, Mi, dy, L.out_proj.g, L.out_bias.g);
  for (int b = 0; b < P.B; ++b) {
    const float* bc = L.dbc.data() + b * T * W1;
    float* dbc = ddbc + b * T * W1;
    ctx.ops->mamba1_scan_backward(ctx, L.conv.data() + b * T * I, I, L.dt.data() + b * T * I, L.A.data(), bc + R,
                                  bc + R + N, W1, L.D.p, L.proj.data() + b * T * 2 * I + I, 2 * I, nullptr, P.T, I,
                                  N, dy + b * T * I, dconv + b * T * I, I, ddt + b * T * I, dA.data(), dbc + R,
                                  dbc + R + N, W1, L.D.g, dproj + b * T * 2 * I + I, 2 * I, nullptr);
  }
  for (size_t i = 0; i < dA.size(); ++i) L.A_log.g[i] += dA[i] * L.A[i];  // dA/dA_log = A
  for (size_t i = 0; i < M * I; ++i) ddt[i] *= softplus_grad(L.dt_raw[i]);
  float* ddtl = P.ws.get(5, M * R);
  float* dconv2 = P.ws.get(6, M * I);
  ctx.ops->matmul_backward(ctx, view(L.dt_proj.p, I, R), L.dtl.data(), ddt, Mi, ddtl, L.dt_proj.g, L.dt_bias.g);
  for (size_t t = 0; t < M; ++t) std::copy(ddtl + t * R, ddtl + t * R + R, ddbc + t * W1);
  ctx.ops->matmul_backward(ctx, view(L.x_proj.p, W1, I), L.conv.data(), ddbc, Mi, dconv2, L.x_proj.g, nullptr);
  add_into(dconv, dconv2, M * I);
  conv_rows_backward(P, L, L.proj.data(), 2 * I, I, K, true, dconv, dproj);
  ctx.ops->matmul_backward(ctx, view(L.in_proj.p, 2 * I, P.H), u, dproj, Mi, du, L.in_proj.g, L.in_bias.g);
}

void mamba2_forward(const Pass& P, TrainModel::Layer& L, const float* u, float* out) {
  const Mamba2Spec& s = L.spec->m2;
  const KernelContext& ctx = P.ctx;
  const int I = s.d_inner, N = s.d_state, K = s.d_conv, nh = s.n_heads, G = s.n_groups;
  const int W = s.in_proj_dim(), cd = s.conv_dim();
  const size_t M = P.M(), T = P.T;
  float* proj = sized(L.proj, M * W);
  ctx.ops->matmul_train(ctx, view(L.in_proj.p, W, P.H), L.in_bias.p, u, static_cast<int>(M), proj);
  float* conv = sized(L.conv, M * cd);
  conv_rows(P, L, proj + I, W, cd, K, true, conv);
  float* dt_raw = sized(L.dt_raw, M * nh);
  for (size_t t = 0; t < M; ++t)
    for (int h = 0; h < nh; ++h) dt_raw[t * nh + h] = proj[t * W + I + cd + h] + L.dt_bias.p[h];
  float* dt = sized(L.dt, M * nh);
  std::copy(dt_raw, dt_raw + M * nh, dt);
  ctx.ops->softplus(ctx, dt, M * nh);
  for (size_t i = 0; i < M * nh; ++i) dt[i] = std::clamp(dt[i], s.dt_min, s.dt_max);
  float* A = sized(L.A, nh);
  for (int h = 0; h < nh; ++h) A[h] = -std::exp(L.A_log.p[h]);
  float* y = sized(L.y, M * I);
  const SsdDims dims{nh, s.head_dim, G, N};
  const size_t state_floats = static_cast<size_t>(nh) * s.head_dim * N;
  float* S = P.ws.get(kForwardState, state_floats);
  for (int b = 0; b < P.B; ++b) {
    std::fill(S, S + state_floats, 0.0f);
    const float* xr = conv + b * T * cd;
    ctx.ops->ssd_scan(ctx, xr, cd, dt + b * T * nh, A, xr + I, xr + I + G * N, cd, L.D.p, dims,
                      std::min(s.chunk_size, kTrainSsdChunk), S, P.T, y + b * T * I);
  }
  const int group = s.norm_grouping == NormGrouping::Grouped ? I / G : I;
  float* g = sized(L.g, M * I);
  ctx.ops->gated_rmsnorm(ctx, y, proj, W, L.norm.p, static_cast<int>(M), I, group, s.norm_eps, g);
  ctx.ops->matmul_train(ctx, view(L.out_proj.p, P.H, I), L.out_bias.p, g, static_cast<int>(M), out);
}

void mamba2_backward(const Pass& P, TrainModel::Layer& L, const float* u, const float* dout, float* du) {
  const Mamba2Spec& s = L.spec->m2;
  const KernelContext& ctx = P.ctx;
  const int I = s.d_inner, N = s.d_state, K = s.d_conv, nh = s.n_heads, G = s.n_groups;
  const int W = s.in_proj_dim(), cd = s.conv_dim();
  const size_t M = P.M(), T = P.T;
  const int Mi = static_cast<int>(M);
  // Every kernel writes these whole (ops.inc; dproj: z by the gated norm, x B C by the conv, dt
  // below), so they are not cleared; dA accumulates.
  float* dg = P.ws.get(0, M * I);
  float* dy = P.ws.get(1, M * I);
  float* dproj = P.ws.get(2, M * W);
  float* dconv = P.ws.get(3, M * cd);
  float* ddt = P.ws.get(4, M * nh);
  std::vector<float> dA(nh, 0.0f);
  ctx.ops->matmul_backward(ctx, view(L.out_proj.p, P.H, I), L.g.data(), dout, Mi, dg, L.out_proj.g, L.out_bias.g);
  const int group = s.norm_grouping == NormGrouping::Grouped ? I / G : I;
  ctx.ops->gated_rmsnorm_backward(ctx, L.y.data(), L.proj.data(), W, L.norm.p, Mi, I, group, s.norm_eps, dg, dy, dproj,
                                  W, L.norm.g);
  const SsdDims dims{nh, s.head_dim, G, N};
  for (int b = 0; b < P.B; ++b) {
    const float* xr = L.conv.data() + b * T * cd;
    float* dxr = dconv + b * T * cd;
    ctx.ops->ssd_scan_backward(ctx, xr, cd, L.dt.data() + b * T * nh, L.A.data(), xr + I, xr + I + G * N, cd, L.D.p,
                               dims, std::min(s.chunk_size, kTrainSsdChunk), nullptr, P.T, dy + b * T * I, dxr, cd,
                               ddt + b * T * nh, dA.data(), dxr + I, dxr + I + G * N, cd, L.D.g, nullptr);
  }
  for (int h = 0; h < nh; ++h) L.A_log.g[h] += dA[h] * L.A[h];
  // dt = clamp(softplus(raw), dt_min, dt_max): the clamp passes the gradient inside its bounds.
  for (size_t t = 0; t < M; ++t)
    for (int h = 0; h < nh; ++h) {
      const size_t i = t * nh + h;
      const float d = L.dt[i] > s.dt_min && L.dt[i] < s.dt_max ? ddt[i] * softplus_grad(L.dt_raw[i]) : 0.0f;
      dproj[t * W + I + cd + h] = d;
      L.dt_bias.g[h] += d;
    }
  conv_rows_backward(P, L, L.proj.data() + I, W, cd, K, true, dconv, dproj + I);
  ctx.ops->matmul_backward(ctx, view(L.in_proj.p, W, P.H), u, dproj, Mi, du, L.in_proj.g, L.in_bias.g);
}

// The discrete Mamba-2 (m2d): in_proj -> [xBC | z | A~]; the causal conv over xBC (SiLU only if
// the spec says so); the scan with log-decay -softplus(A~) per token and head and no dt;
// g = y * silu(z + z_bias); out_proj.
void m2d_forward(const Pass& P, TrainModel::Layer& L, const float* u, float* out) {
  const Mamba2DiscreteSpec& s = L.spec->m2d;
  const KernelContext& ctx = P.ctx;
  const int I = s.d_inner, N = s.d_state, K = s.d_conv, nh = s.n_heads, G = s.n_groups;
  const int W = s.in_proj_dim(), cd = s.conv_dim();
  const size_t M = P.M(), T = P.T;
  float* proj = sized(L.proj, M * W);
  ctx.ops->matmul_train(ctx, view(L.in_proj.p, W, P.H), L.in_bias.p, u, static_cast<int>(M), proj);
  float* conv = sized(L.conv, M * cd);
  conv_rows(P, L, proj, W, cd, K, s.conv_silu, conv);
  float* la = sized(L.dt, M * nh);  // -softplus(A~)
  for (size_t t = 0; t < M; ++t) std::copy_n(proj + t * W + cd + I, nh, la + t * nh);
  ctx.ops->softplus(ctx, la, M * nh);
  for (size_t i = 0; i < M * nh; ++i) la[i] = -la[i];
  float* y = sized(L.y, M * I);
  const SsdDims dims{nh, s.head_dim, G, N};
  const size_t state_floats = static_cast<size_t>(nh) * s.head_dim * N;
  float* S = P.ws.get(kForwardState, state_floats);
  for (int b = 0; b < P.B; ++b) {
    std::fill(S, S + state_floats, 0.0f);
    const float* xr = conv + b * T * cd;
    ctx.ops->ssd_scan_discrete(ctx, xr, cd, la + b * T * nh, xr + I, xr + I + G * N, cd, L.D.p, dims,
                               std::min(s.chunk_size, kTrainSsdChunk), S, P.T, y + b * T * I);
  }
  float* gate = sized(L.zg, M * I);
  for (size_t t = 0; t < M; ++t)
    for (int i = 0; i < I; ++i) gate[t * I + i] = proj[t * W + cd + i] + (L.z_bias ? L.z_bias.p[i] : 0.0f);
  float* g = sized(L.g, M * I);
  ctx.ops->activation(ctx, Activation::Silu, gate, y, I, static_cast<int>(M), I, g);
  ctx.ops->matmul_train(ctx, view(L.out_proj.p, P.H, I), L.out_bias.p, g, static_cast<int>(M), out);
}

void m2d_backward(const Pass& P, TrainModel::Layer& L, const float* u, const float* dout, float* du) {
  const Mamba2DiscreteSpec& s = L.spec->m2d;
  const KernelContext& ctx = P.ctx;
  const int I = s.d_inner, N = s.d_state, K = s.d_conv, nh = s.n_heads, G = s.n_groups;
  const int W = s.in_proj_dim(), cd = s.conv_dim();
  const size_t M = P.M(), T = P.T;
  const int Mi = static_cast<int>(M);
  // Written whole before they are read (dproj: xBC by the conv, z and A~ here).
  float* dg = P.ws.get(0, M * I);
  float* dy = P.ws.get(1, M * I);
  float* dproj = P.ws.get(2, M * W);
  float* dconv = P.ws.get(3, M * cd);
  float* dla = P.ws.get(4, M * nh);
  float* dgate = P.ws.get(5, M * I);
  ctx.ops->matmul_backward(ctx, view(L.out_proj.p, P.H, I), L.g.data(), dout, Mi, dg, L.out_proj.g, L.out_bias.g);
  ctx.ops->activation_backward(ctx, Activation::Silu, L.zg.data(), L.y.data(), I, Mi, I, dg, dgate, dy);
  for (size_t t = 0; t < M; ++t) {
    std::copy_n(dgate + t * I, I, dproj + t * W + cd);
    if (L.z_bias) add_into(L.z_bias.g, dgate + t * I, I);
  }
  const SsdDims dims{nh, s.head_dim, G, N};
  for (int b = 0; b < P.B; ++b) {
    const float* xr = L.conv.data() + b * T * cd;
    float* dxr = dconv + b * T * cd;
    ctx.ops->ssd_scan_discrete_backward(ctx, xr, cd, L.dt.data() + b * T * nh, xr + I, xr + I + G * N, cd, L.D.p, dims,
                                        std::min(s.chunk_size, kTrainSsdChunk), nullptr, P.T, dy + b * T * I, dxr, cd,
                                        dla + b * T * nh, dxr + I, dxr + I + G * N, cd, L.D.g, nullptr);
  }
  // log-decay = -softplus(A~)
  for (size_t t = 0; t < M; ++t)
    for (int h = 0; h < nh; ++h) {
      const size_t a = t * W + cd + I + h;
      dproj[a] = -dla[t * nh + h] * softplus_grad(L.proj[a]);
    }
  conv_rows_backward(P, L, L.proj.data(), W, cd, K, s.conv_silu, dconv, dproj);
  ctx.ops->matmul_backward(ctx, view(L.in_proj.p, W, P.H), u, dproj, Mi, du, L.in_proj.g, L.in_bias.g);
}

PagedKv contiguous_kv(const float* k, const float* v, int T, int n_kv, int hd, const int32_t* page0) {
  PagedKv kv;
  kv.k = const_cast<float*>(k);
  kv.v = const_cast<float*>(v);
  kv.pages = page0;
  kv.block_size = T;
  kv.n_kv_heads = n_kv;
  kv.head_dim = hd;
  kv.page_stride = static_cast<size_t>(T) * n_kv * hd;
  kv.dtype = DType::F32;
  kv.set_token_major();
  return kv;
}

void attention_forward(const Pass& P, TrainModel::Layer& L, const float* u, float* out) {
  const AttentionSpec& s = L.spec->attn;
  const KernelContext& ctx = P.ctx;
  const int nh = s.n_heads, kvh = s.n_kv_heads, hd = s.head_dim, qd = nh * hd, kd = kvh * hd;
  const size_t M = P.M(), T = P.T;
  const int Mi = static_cast<int>(M);
  float* q = sized(L.qa, M * qd);
  float* k = sized(L.ka, M * kd);
  float* v = sized(L.va, M * kd);
  ctx.ops->matmul_train(ctx, view(L.q.p, qd, P.H), L.q_bias.p, u, Mi, q);
  ctx.ops->matmul_train(ctx, view(L.k.p, kd, P.H), L.k_bias.p, u, Mi, k);
  ctx.ops->matmul_train(ctx, view(L.v.p, kd, P.H), L.v_bias.p, u, Mi, v);
  if (s.qk_norm) {
    L.q_pre.assign(q, q + M * qd);
    L.k_pre.assign(k, k + M * kd);
    ctx.ops->rmsnorm(ctx, L.q_pre.data(), L.q_norm.p, Mi * nh, hd, s.qk_norm_eps, q);
    ctx.ops->rmsnorm(ctx, L.k_pre.data(), L.k_norm.p, Mi * kvh, hd, s.qk_norm_eps, k);
  }
  float* att = sized(L.att, M * qd);
  const int32_t page0 = 0;
  for (int b = 0; b < P.B; ++b) {
    if (s.rope_dim > 0) {
      ctx.ops->rope(ctx, q + b * T * qd, qd, P.T, 0, nh, hd, s.rope_dim, s.rope_theta);
      ctx.ops->rope(ctx, k + b * T * kd, kd, P.T, 0, kvh, hd, s.rope_dim, s.rope_theta);
    }
    const PagedKv kv = contiguous_kv(k + b * T * kd, v + b * T * kd, P.T, kvh, hd, &page0);
    ctx.ops->attention(ctx, q + b * T * qd, qd, kv, 0, P.T, nh, s.softmax_scale(), att + b * T * qd);
  }
  ctx.ops->matmul_train(ctx, view(L.o.p, P.H, qd), L.o_bias.p, att, Mi, out);
}

void attention_backward(const Pass& P, TrainModel::Layer& L, const float* u, const float* dout, float* du) {
  const AttentionSpec& s = L.spec->attn;
  const KernelContext& ctx = P.ctx;
  const int nh = s.n_heads, kvh = s.n_kv_heads, hd = s.head_dim, qd = nh * hd, kd = kvh * hd;
  const size_t M = P.M(), T = P.T;
  const int Mi = static_cast<int>(M);
  // Every kernel writes these whole (ops.inc), so they are not cleared.
  float* datt = P.ws.get(0, M * qd);
  float* dq = P.ws.get(1, M * qd);
  float* dk = P.ws.get(2, M * kd);
  float* dv = P.ws.get(3, M * kd);
  float* tmp = P.ws.get(4, M * P.H);
  ctx.ops->matmul_backward(ctx, view(L.o.p, P.H, qd), L.att.data(), dout, Mi, datt, L.o.g, L.o_bias.g);
  for (int b = 0; b < P.B; ++b) {
    ctx.ops->attention_backward(ctx, L.qa.data() + b * T * qd, qd, L.ka.data() + b * T * kd,
                                L.va.data() + b * T * kd, P.T, nh, kvh, hd, s.softmax_scale(), datt + b * T * qd,
                                dq + b * T * qd, dk + b * T * kd, dv + b * T * kd);
    if (s.rope_dim > 0) {
      ctx.ops->rope_backward(ctx, dq + b * T * qd, qd, P.T, 0, nh, hd, s.rope_dim, s.rope_theta);
      ctx.ops->rope_backward(ctx, dk + b * T * kd, kd, P.T, 0, kvh, hd, s.rope_dim, s.rope_theta);
    }
  }
  if (s.qk_norm) {  // through the norms: the gradients before them replace dq and dk
    float* dqn = P.ws.get(5, M * qd);
    ctx.ops->rmsnorm_backward(ctx, L.q_pre.data(), L.q_norm.p, dq, Mi * nh, hd, s.qk_norm_eps, dqn, L.q_norm.g);
    dq = dqn;
    float* dkn = P.ws.get(6, M * kd);
    ctx.ops->rmsnorm_backward(ctx, L.k_pre.data(), L.k_norm.p, dk, Mi * kvh, hd, s.qk_norm_eps, dkn, L.k_norm.g);
    dk = dkn;
  }
  ctx.ops->matmul_backward(ctx, view(L.q.p, qd, P.H), u, dq, Mi, du, L.q.g, L.q_bias.g);
  ctx.ops->matmul_backward(ctx, view(L.k.p, kd, P.H), u, dk, Mi, tmp, L.k.g, L.k_bias.g);
  add_into(du, tmp, M * P.H);
  ctx.ops->matmul_backward(ctx, view(L.v.p, kd, P.H), u, dv, Mi, tmp, L.v.g, L.v_bias.g);
  add_into(du, tmp, M * P.H);
}

// A gated MLP's gate and up weights lie next to each other in the parameter buffer, gate first
// (build_tensors checks it), and so do their gradients: one (2F, H) product computes both,
// a: (M, 2F) = [u gate^T | u up^T], and one backward product gives du and both dW.
void mlp_forward(const Pass& P, TrainModel::Layer& L, const float* u, float* out) {
  const MlpSpec& s = L.spec->ffn.mlp;
  const KernelContext& ctx = P.ctx;
  const int F = s.d_ff, Mi = static_cast<int>(P.M());
  float* m = sized(L.m, P.M() * F);
  if (s.gated) {
    float* a = sized(L.a, P.M() * 2 * F);
    ctx.ops->matmul_train(ctx, view(L.gate.p, 2 * F, P.H), nullptr, u, Mi, a);
    ctx.ops->activation(ctx, s.act, a, a + F, 2 * F, Mi, F, m);
  } else {
    float* b = sized(L.b, P.M() * F);
    ctx.ops->matmul_train(ctx, view(L.up.p, F, P.H), nullptr, u, Mi, b);
    ctx.ops->activation(ctx, s.act, b, nullptr, F, Mi, F, m);
  }
  ctx.ops->matmul_train(ctx, view(L.down.p, P.H, F), nullptr, m, Mi, out);
}

void mlp_backward(const Pass& P, TrainModel::Layer& L, const float* u, const float* dout, float* du) {
  const MlpSpec& s = L.spec->ffn.mlp;
  const KernelContext& ctx = P.ctx;
  const int F = s.d_ff, Mi = static_cast<int>(P.M());
  // Every kernel writes these whole (ops.inc), so they are not cleared.
  float* dm = P.ws.get(0, P.M() * F);
  ctx.ops->matmul_backward(ctx, view(L.down.p, P.H, F), L.m.data(), dout, Mi, dm, L.down.g, nullptr);
  if (s.gated) {
    float* da = P.ws.get(1, P.M() * 2 * F);  // [dgate | dup] rows, as a
    ctx.ops->activation_backward(ctx, s.act, L.a.data(), L.a.data() + F, 2 * F, Mi, F, dm, da, da + F);
    ctx.ops->matmul_backward(ctx, view(L.gate.p, 2 * F, P.H), u, da, Mi, du, L.gate.g, nullptr);
  } else {
    float* db = P.ws.get(1, P.M() * F);
    ctx.ops->activation_backward(ctx, s.act, L.b.data(), nullptr, F, Mi, F, dm, db, nullptr);
    ctx.ops->matmul_backward(ctx, view(L.up.p, F, P.H), u, db, Mi, du, L.up.g, nullptr);
  }
}

}  // namespace

// The kernels' scratch for calls of `tokens` rows: the model's shapes, forward and backward (the
// transposed products of matmul_backward); grown, never shrunk.
void TrainModel::reserve_kernels(int tokens) {
  if (tokens <= scratch_tokens_) return;
  scratch_tokens_ = tokens;
  KernelLimits lim;
  lim.tokens = tokens;
  lim.backward = true;
  for (const TrainTensor& t : tensors_)
    if (t.shape.size() == 2) {
      lim.matmul_rows = std::max(lim.matmul_rows, static_cast<int>(t.shape[0]));
      lim.matmul_cols = std::max(lim.matmul_cols, static_cast<int>(t.shape[1]));
    }
  // The conv and scan shapes: what each layer's mixer declares (its weights are not needed).
  for (const BlockSpec& b : cfg_.blocks)
    if (const std::unique_ptr<Mixer> m = make_mixer(b, cfg_.d_model)) m->kernel_limits(lim);
  scratch_.reserve(ctx_.pool ? ctx_.pool->size() : 1, ctx_.ops->scratch_floats(lim));
}

double TrainModel::forward_backward(const int32_t* ids, int B, int len, bool backward, float grad_scale) {
  check(B >= 1 && len >= 2, "training: a batch needs at least one row of two tokens (got ", B, " x ", len, ")");
  const int T = len - 1, H = cfg_.d_model, V = cfg_.vocab_size;
  const size_t M = static_cast<size_t>(B) * T;
  // Per-row kernels (the scans, the conv) see T rows; the matmuls see all M.
  reserve_kernels(static_cast<int>(M));
  inputs_.resize(M);
  targets_.resize(M);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < len; ++t) {
      const int32_t id = ids[static_cast<size_t>(b) * len + t];
      check(id >= 0 && id < V, "training: token id ", id, " at row ", b, " position ", t, " is outside the vocabulary (",
            V, ")");
      if (t < T) inputs_[static_cast<size_t>(b) * T + t] = id;
      if (t > 0) targets_[static_cast<size_t>(b) * T + t - 1] = id;
    }
  const Pass P{ctx_, B, T, H, workspace_};
  const float eps = cfg_.norm_eps;
  const Param E{param(cfg_.embedding_name).data(), grad(cfg_.embedding_name).data()};
  const Param head = cfg_.tie_embeddings ? E : Param{param(cfg_.lm_head_name).data(), grad(cfg_.lm_head_name).data()};
  const Param final_norm{param(cfg_.final_norm_name).data(), grad(cfg_.final_norm_name).data()};

  // Forward: the residual stream entering each layer is that layer's h_in (the embedding writes
  // the first), each residual add writes the next one out of place (h_mid inside a layer, then
  // the next layer's h_in or, after the last, h_final_): no copies, and backward reads them all.
  float* h = sized(layers_.empty() ? h_final_ : layers_.front()->h_in, M * H);
  ctx_.ops->embedding(view(E.p, V, H), inputs_.data(), static_cast<int>(M), h);
  float* out = sized(dtmp_, M * H);  // a block's output (dtmp_ is backward's until then)
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer* L = layers_[li];
    ctx_.ops->rmsnorm(ctx_, h, L->mixer_norm.p, static_cast<int>(M), H, eps, sized(L->u, M * H));
    switch (L->spec->mixer) {
      case MixerKind::Mamba1: mamba1_forward(P, *L, L->u.data(), out); break;
      case MixerKind::Mamba2: mamba2_forward(P, *L, L->u.data(), out); break;
      case MixerKind::Mamba2Discrete: m2d_forward(P, *L, L->u.data(), out); break;
      default: attention_forward(P, *L, L->u.data(), out); break;
    }
    if (L->spec->ffn.kind == FfnKind::Mlp) {
      float* mid = sized(L->h_mid, M * H);
      add_to(h, out, M * H, mid);
      h = mid;
      ctx_.ops->rmsnorm(ctx_, h, L->ffn_norm.p, static_cast<int>(M), H, eps, sized(L->u2, M * H));
      mlp_forward(P, *L, L->u2.data(), out);
    }
    float* next = sized(li + 1 < layers_.size() ? layers_[li + 1]->h_in : h_final_, M * H);
    add_to(h, out, M * H, next);
    h = next;
  }
  float* hn = sized(hn_, M * H);
  ctx_.ops->rmsnorm(ctx_, h, final_norm.p, static_cast<int>(M), H, eps, hn);
  float* logits = sized(logits_, M * V);
  ctx_.ops->matmul_train(ctx_, view(head.p, V, H), nullptr, hn, static_cast<int>(M), logits);
  const double loss_sum = ctx_.ops->cross_entropy(ctx_, logits, targets_.data(), static_cast<int>(M), V,
                                                  grad_scale / static_cast<float>(M), backward ? logits : nullptr);
  if (!backward) return loss_sum / static_cast<double>(M);

  // Backward: logits_ now holds d(loss)/d(logits) x grad_scale.
  float* dh = sized(dh_, M * H);
  float* dtmp = sized(dtmp_, M * H);
  float* du = sized(du_, M * H);
  ctx_.ops->matmul_backward(ctx_, view(head.p, V, H), hn, logits, static_cast<int>(M), dtmp, head.g, nullptr);
  ctx_.ops->rmsnorm_backward(ctx_, h, final_norm.p, dtmp, static_cast<int>(M), H, eps, dh, final_norm.g);
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    Layer* L = *it;
    if (L->spec->ffn.kind == FfnKind::Mlp) {
      mlp_backward(P, *L, L->u2.data(), dh, du);
      ctx_.ops->rmsnorm_backward(ctx_, L->h_mid.data(), L->ffn_norm.p, du, static_cast<int>(M), H, eps, dtmp,
                                 L->ffn_norm.g);
      add_into(dh, dtmp, M * H);
    }
    switch (L->spec->mixer) {
      case MixerKind::Mamba1: mamba1_backward(P, *L, L->u.data(), dh, du); break;
      case MixerKind::Mamba2: mamba2_backward(P, *L, L->u.data(), dh, du); break;
      case MixerKind::Mamba2Discrete: m2d_backward(P, *L, L->u.data(), dh, du); break;
      default: attention_backward(P, *L, L->u.data(), dh, du); break;
    }
    ctx_.ops->rmsnorm_backward(ctx_, L->h_in.data(), L->mixer_norm.p, du, static_cast<int>(M), H, eps, dtmp,
                               L->mixer_norm.g);
    add_into(dh, dtmp, M * H);
  }
  ctx_.ops->embedding_backward(ctx_, inputs_.data(), dh, static_cast<int>(M), H, E.g);
  return loss_sum / static_cast<double>(M);
}

}  // namespace hybridlm
