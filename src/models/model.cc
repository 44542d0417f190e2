#include "models/model.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "kernels/kernels.h"
#include "models/plan.h"

namespace hybridlm {

Model Model::load(const std::filesystem::path& dir, const LoadOptions& opt) {
  Model m;
  m.cfg_ = load_config(dir, opt.mamba2_norm);
  // The files are always mapped. Without use_mmap every matrix is copied out of them (and its
  // pages released, WeightReader::slice) and the mapping is closed once loading ends: reading the
  // whole files into memory first held them beside the copy (peak RSS twice the weights).
  auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir, /*use_mmap=*/true));
  m.stored_dtype_ = checkpoint_weight_dtype(*ckpt);
  m.dtype_ = opt.dtype ? *opt.dtype : auto_weight_dtype(m.stored_dtype_);
  const WeightReader r(*ckpt, m.dtype_, /*zero_copy=*/opt.use_mmap, opt.on_tensor);
  m.load_weights(r);
  for (const TensorEntry& t : tensors(m.cfg_))
    if (t.kind != TensorEntry::Vector) m.matmul_cols_ = std::max(m.matmul_cols_, static_cast<int>(t.shape.back()));
  m.params_ = r.params_read();
  m.weight_bytes_ = r.bytes_held();
  m.mapped_bytes_ = r.bytes_mapped();
  if (m.mapped_bytes_ > 0) m.checkpoint_ = std::move(ckpt);
  return m;
}

std::vector<TensorEntry> Model::tensors(const HybridConfig& c) {
  Model m;
  m.cfg_ = c;
  const TensorCatalog catalog;
  m.load_weights(catalog);
  return catalog.entries();
}

// A norm weight as the norm applies it: offset + w (zero-centred norms store w, apply 1 + w).
static std::vector<float> offset_norm(std::vector<float> w, float offset) {
  if (offset != 0.0f)
    for (float& x : w) x += offset;
  return w;
}

void Model::load_weights(const TensorSource& r) {
  const HybridConfig& c = cfg_;
  const int64_t H = c.d_model, V = c.vocab_size;
  const bool alias = !c.embedding_alias.empty() && !r.has(c.embedding_name) && r.has(c.embedding_alias);
  embedding_ = r.matrix(alias ? c.embedding_alias : c.embedding_name, {V, H});
  // Zamba / Zamba2: each shared block is stored once, under the first of its hybrid layers whose
  // checkpoint entry holds it (tied copies are dropped on save; which one survives varies).
  for (int sb = 0; sb < c.shared.n_blocks; ++sb) {
    std::string prefix;
    for (const BlockSpec& b : c.blocks)
      if (b.shared_block == sb && r.has(b.names.mixer2 + c.shared.name + "input_layernorm.weight")) {
        prefix = b.names.mixer2 + c.shared.name;
        break;
      }
    if (prefix.empty())
      throw Error("no tensors for shared transformer block " + std::to_string(sb) + " (looked for <layer>." +
                  c.shared.name + "input_layernorm.weight at each hybrid layer using it)");
    shared_.push_back(load_shared_block(r, prefix, c.shared, c.d_model));
  }
  for (int i = 0; i < c.n_layers(); ++i) {
    const BlockSpec& b = c.blocks[i];
    const BlockNames& n = b.names;
    LayerWeights lw;
    lw.mixer = make_mixer(b, c.d_model);
    if (lw.mixer) {
      lw.norm = offset_norm(r.vector(n.mixer_norm, {H}), c.norm_offset);
      lw.mixer->load(r);
    }
    if (b.shared_block >= 0)
      lw.zamba = load_zamba2_layer(r, shared_[b.shared_block].prefix, n.mixer2, c.shared, b.adapter, c.d_model);
    if (b.ffn.kind != FfnKind::None) {
      lw.ffn_norm = offset_norm(r.vector(n.ffn_norm, {H}), c.norm_offset);
      lw.ffn = load_ffn(r, n.ffn, b.ffn, c.d_model);
    }
    layers_.push_back(std::move(lw));
  }
  norm_f_ = offset_norm(r.vector(c.final_norm_name, {H}), c.norm_offset);
  if (!c.tie_embeddings) lm_head_ = r.matrix(c.lm_head_name, {V, H});
}

std::vector<LayerCacheSpec> Model::cache_specs() const { return hybridlm::cache_specs(cfg_); }

size_t Model::scratch_floats(int T) const {
  size_t n = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l].mixer) n = std::max(n, layers_[l].mixer->scratch_floats(T));
    if (cfg_.blocks[l].shared_block >= 0) n = std::max(n, zamba2_scratch_floats(cfg_.shared, cfg_.d_model, T));
  }
  return n;
}

KernelLimits Model::kernel_limits(int T) const {
  KernelLimits lim;
  lim.tokens = T;
  lim.matmul_cols = matmul_cols_;
  for (const LayerWeights& l : layers_)
    if (l.mixer) l.mixer->kernel_limits(lim);
  return lim;
}

void Model::reserve_kernels(ForwardScratch& sc, const KernelContext& ctx, int T) const {
  const int threads = ctx.pool ? ctx.pool->size() : 1;
  if (T <= sc.kernel_tokens && threads <= sc.kernel_threads) return;
  sc.kernel_tokens = std::max(T, sc.kernel_tokens);
  sc.kernel_threads = std::max(threads, sc.kernel_threads);
  ScratchNeed need = ctx.ops->scratch_floats(kernel_limits(sc.kernel_tokens));
  // for_each_run (blocks/seq_run.h) runs single-token runs one per thread, and Mamba-1's batch-1
  // decode a block of channels per thread (blocks/mamba1.cc), each thread then the kernels' caller.
  need.worker = std::max(need.worker, ctx.ops->scratch_floats(kernel_limits(1)).caller);
  sc.kernels.reserve(sc.kernel_threads, need);
}

void Model::reserve(ForwardScratch& sc, const KernelContext& ctx, int T, int seqs) const {
  const size_t TH = static_cast<size_t>(T) * cfg_.d_model;
  for (std::vector<float>* v : {&sc.h, &sc.xn, &sc.mix}) v->reserve(TH);
  if (!shared_.empty()) sc.emb.reserve(TH);
  sc.mix2.reserve(TH);
  sc.runs.reserve(static_cast<size_t>(seqs));
  if (const size_t need = scratch_floats(T); sc.arena.size() < need) sc.arena.resize(need);
  reserve_kernels(sc, ctx, T);
}

void Model::check_tokens(std::span<const int32_t> tokens) const {
  const int V = cfg_.vocab_size;
  for (int32_t id : tokens)
    check(id >= 0 && id < V, "token id ", id, " is outside the vocabulary (size ", V, ")");
}

void Model::forward(const KernelContext& ctx, std::span<const int32_t> tokens, std::span<const BatchRun> runs,
                    HybridCache& cache, std::span<const int> logit_rows, float* logits, ForwardScratch& sc) const {
  const int T = static_cast<int>(tokens.size());
  const int H = cfg_.d_model;
  // Validate first: nothing below may fail once state starts changing.
  size_t total = 0;
  for (const BatchRun& r : runs) {
    check(r.len > 0, "batch run of ", r.len, " tokens");
    check(cache.is_live(r.seq), "batch run names sequence ", r.seq, ", which is not in the cache");
    total += static_cast<size_t>(r.len);
  }
  check(total == tokens.size(), "batch runs cover ", total, " tokens, batch has ", tokens.size());
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = i + 1; j < runs.size(); ++j)
      check(runs[i].seq != runs[j].seq, "two runs of one batch continue the same sequence ", runs[i].seq);
  check_tokens(tokens);
  for (int row : logit_rows) check(row >= 0 && row < T, "logit row ", row, " out of range");
  if (T == 0) return;
  reserve_kernels(sc, ctx, T);  // past reserve(): grows once
  KernelContext kc = ctx;
  kc.scratch = &sc.kernels;
  cache.prepare(runs);  // KV pages for the new tokens; throws (changing nothing) when full
  try {
    forward_layers(kc, tokens, runs, cache, sc);
  } catch (...) {
    cache.fail_step(runs);  // only an internal failure (out of memory) gets here
    throw;
  }
  cache.commit(runs);
  // logits: (rows, V) = rmsnorm(h[rows]) @ lm_head^T (or the tied embedding table)
  const int R = static_cast<int>(logit_rows.size());
  if (R == 0) return;
  sc.rows.resize(static_cast<size_t>(R) * H);
  for (int i = 0; i < R; ++i)
    std::copy_n(sc.h.data() + static_cast<size_t>(logit_rows[i]) * H, H, sc.rows.data() + static_cast<size_t>(i) * H);
  kc.ops->rmsnorm(kc, sc.rows.data(), norm_f_.data(), R, H, cfg_.norm_eps, sc.rows.data());
  const Matrix& head = cfg_.tie_embeddings ? embedding_ : lm_head_;
  kc.ops->matmul(kc, head.view(), nullptr, sc.rows.data(), R, logits);
  if (cfg_.logits_multiplier != 1.0f)
    for (size_t i = 0; i < static_cast<size_t>(R) * cfg_.vocab_size; ++i) logits[i] *= cfg_.logits_multiplier;
}

void Model::forward_layers(const KernelContext& ctx, std::span<const int32_t> tokens, std::span<const BatchRun> runs,
                           HybridCache& cache, ForwardScratch& sc) const {
  const int T = static_cast<int>(tokens.size());
  const int H = cfg_.d_model;

  if (const size_t need = scratch_floats(T); sc.arena.size() < need) sc.arena.resize(need);  // past reserve()
  sc.h.resize(static_cast<size_t>(T) * H);
  sc.xn.resize(static_cast<size_t>(T) * H);
  sc.mix.resize(static_cast<size_t>(T) * H);
  // h: (T, H) = embedding[tokens]; the residual stream stays f32 (residual_in_fp32).
  ctx.ops->embedding(embedding_.view(), tokens.data(), T, sc.h.data());
  if (cfg_.embedding_multiplier != 1.0f)
    for (float& v : sc.h) v *= cfg_.embedding_multiplier;
  const float rm = cfg_.residual_multiplier;
  if (!shared_.empty()) sc.emb = sc.h;  // Zamba2's shared blocks read the original embeddings
  const std::vector<LayerCacheSpec>& kinds = cache.layers();
  for (int l = 0; l < cfg_.n_layers(); ++l) {
    const BlockSpec& b = cfg_.blocks[l];
    const LayerWeights& w = layers_[l];
    sc.runs.clear();
    // f32 views of this layer's state (a no-op for f32 storage). A decode step updates bf16 SSM
    // states in place in the mixers whose kernels take them (SeqRun::ssm_state_bf16).
    const bool bf16_in_place = w.mixer && w.mixer->bf16_state_in_place();
    cache.load_state(runs, l, ctx.pool, bf16_in_place);
    int start = 0;
    for (const BatchRun& r : runs) {
      SeqRun s;
      s.start = start;
      s.len = r.len;
      s.pos0 = cache.seq_length(r.seq);
      if (kinds[l].has_state()) {
        s.conv_state = cache.conv_state(r.seq, l);
        s.ssm_state = cache.ssm_state(r.seq, l);
        s.ssm_state_bf16 = cache.ssm_state_bf16(r.seq, l);
      }
      if (kinds[l].has_kv()) s.kv = cache.kv(r.seq, l);
      sc.runs.push_back(s);
      start += r.len;
    }
    if (b.shared_block >= 0) {
      // Zamba2 hybrid layer: t = linear(shared_block(h, emb)); xn = rmsnorm(h + t) * norm_w
      sc.mix2.resize(sc.h.size());
      FloatArena arena(sc.arena.data(), sc.arena.size());
      zamba2_shared_forward(ctx, cfg_.shared, shared_[b.shared_block], w.zamba, sc.h.data(), sc.emb.data(), T, H,
                            sc.runs, arena, sc.mix2.data());
      for (size_t i = 0; i < sc.h.size(); ++i) sc.xn[i] = sc.h[i] + sc.mix2[i];
      ctx.ops->rmsnorm(ctx, sc.xn.data(), w.norm.data(), T, H, cfg_.block_eps(), sc.xn.data());
    } else if (w.mixer) {
      // xn = rmsnorm(h) * norm_w
      ctx.ops->rmsnorm(ctx, sc.h.data(), w.norm.data(), T, H, cfg_.block_eps(), sc.xn.data());
    }
    if (w.mixer) {
      // h += mixer(xn)
      FloatArena arena(sc.arena.data(), sc.arena.size());
      w.mixer->forward(ctx, sc.xn.data(), T, sc.runs, arena, sc.mix.data());
      for (size_t i = 0; i < sc.h.size(); ++i) sc.h[i] += rm * sc.mix[i];
    }
    cache.store_state(runs, l, ctx.pool);
    if (b.ffn.kind != FfnKind::None) {
      // h += ffn(rmsnorm(h) * ffn_norm_w)
      ctx.ops->rmsnorm(ctx, sc.h.data(), w.ffn_norm.data(), T, H, cfg_.block_eps(), sc.xn.data());
      ffn_forward(ctx, b.ffn, w.ffn, sc.xn.data(), T, sc.ffn, sc.mix.data());
      for (size_t i = 0; i < sc.h.size(); ++i) sc.h[i] += rm * sc.mix[i];
    }
  }
}

}  // namespace hybridlm
