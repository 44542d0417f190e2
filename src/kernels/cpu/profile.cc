#include "kernels/profile.h"

#include <array>
#include <atomic>
#include <chrono>
#include <type_traits>

#include "base/thread_pool.h"

namespace hybridlm {

namespace {

// Every op of KernelTable with its name, in declaration order (scratch_floats is not an op).
// clang-format off
#define HYBRIDLM_PROFILED_OPS(X)                                                                              \
  X(matmul) X(quantize_q8_0_rows) X(rmsnorm) X(gated_rmsnorm) X(conv1d_causal) X(mamba1_scan)                \
  X(mamba1_scan_bf16) X(ssd_scan) X(ssd_step) X(ssd_step_bf16) X(mamba2_step) X(mamba2_step_bf16)            \
  X(ssd_scan_discrete) X(ssd_step_discrete) X(gated_delta_scan) X(gated_delta_step) X(softplus) X(embedding) \
  X(rope) X(attention) X(activation) X(matmul_train) X(matmul_backward) X(rmsnorm_backward)                  \
  X(embedding_backward) X(cross_entropy) X(activation_backward) X(conv1d_causal_backward)                   \
  X(gated_rmsnorm_backward) X(rope_backward) X(attention_backward) X(mamba1_scan_backward)                   \
  X(ssd_scan_backward) X(ssd_scan_discrete_backward)
// clang-format on

#define HYBRIDLM_OP_NAME(op) #op,
constexpr const char* kNames[] = {HYBRIDLM_PROFILED_OPS(HYBRIDLM_OP_NAME)};
#undef HYBRIDLM_OP_NAME
constexpr size_t kOps = std::size(kNames);
// The name, scratch_floats and one pointer per op: an op added to KernelTable must be added above.
static_assert(sizeof(KernelTable) == sizeof(const char*) + (kOps + 1) * sizeof(void (*)()),
              "HYBRIDLM_PROFILED_OPS must list every op of KernelTable");

// The table the profiling one forwards to, and the totals (written by the calling thread only;
// atomics so that reading them while a forward runs elsewhere is not a data race).
const KernelTable* g_inner = nullptr;
std::array<std::atomic<int64_t>, kOps> g_ns{}, g_calls{};
thread_local int tl_depth = 0;  // ops calling ops through the table count once, at the outermost

template <auto Field, size_t I>
struct Timed;

// Forwards to the inner table's op; times it when called from outside the thread pool's workers
// (thread index 0: the forward's own thread) and not from within another timed op.
template <class R, class... A, R (*KernelTable::*Field)(A...), size_t I>
struct Timed<Field, I> {
  static R call(A... a) {
    if (tl_depth > 0 || ThreadPool::thread_index() != 0) return (g_inner->*Field)(a...);
    ++tl_depth;
    const auto t0 = std::chrono::steady_clock::now();
    struct Done {  // also when the op throws
      std::chrono::steady_clock::time_point t0;
      ~Done() {
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
        g_ns[I].fetch_add(ns.count(), std::memory_order_relaxed);
        g_calls[I].fetch_add(1, std::memory_order_relaxed);
        --tl_depth;
      }
    } done{t0};
    return (g_inner->*Field)(a...);
  }
};

// The index of each op in kNames, by counting.
enum : size_t {
#define HYBRIDLM_OP_INDEX(op) k_##op,
  HYBRIDLM_PROFILED_OPS(HYBRIDLM_OP_INDEX)
#undef HYBRIDLM_OP_INDEX
};

KernelTable make_table() {
  KernelTable t{};
  t.name = "profile";
#define HYBRIDLM_OP_TIMED(op) t.op = &Timed<&KernelTable::op, k_##op>::call;
  HYBRIDLM_PROFILED_OPS(HYBRIDLM_OP_TIMED)
#undef HYBRIDLM_OP_TIMED
  return t;
}

}  // namespace

const KernelTable& profiling_kernels(const KernelTable& inner) {
  static KernelTable table = make_table();
  g_inner = &inner;
  table.name = inner.name;
  table.scratch_floats = inner.scratch_floats;
  return table;
}

void reset_kernel_profile() {
  for (size_t i = 0; i < kOps; ++i) {
    g_ns[i].store(0, std::memory_order_relaxed);
    g_calls[i].store(0, std::memory_order_relaxed);
  }
}

std::vector<OpTime> kernel_profile() {
  std::vector<OpTime> out;
  for (size_t i = 0; i < kOps; ++i)
    if (const int64_t calls = g_calls[i].load(std::memory_order_relaxed); calls > 0)
      out.push_back({kNames[i], static_cast<double>(g_ns[i].load(std::memory_order_relaxed)) * 1e-9, calls});
  return out;
}

}  // namespace hybridlm
