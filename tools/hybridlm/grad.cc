// `hybridlm grad`: the training view that `score` is for inference. One sequence of token ids,
// its mean next-token cross-entropy as a JSON line, and (--out) the gradient of that loss with
// respect to every parameter, under the checkpoint's own names and shapes, as f32 safetensors.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <memory>

#include "base/error.h"
#include "base/thread_pool.h"
#include "io/safetensors.h"
#include "train/train_model.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

struct GradFlags {
  std::string dir, ids, out, kernels = "cpu", mamba2_norm = "grouped";
  int threads = 0;
};

int cmd_grad(const GradFlags& f) {
  const std::string dir = model_dir_of(f.dir);
  check_model_path(dir);
  const std::vector<int32_t> ids = parse_ids(f.ids, "--ids");
  check(ids.size() >= 2, "--ids: the loss needs at least two tokens (one to predict from, one to predict), got ",
        ids.size());
  const NormGrouping grouping = f.mamba2_norm == "full" ? NormGrouping::Full : NormGrouping::Grouped;
  ThreadPool pool(f.threads > 0 ? f.threads : available_cores());
  TrainModel model(load_config(dir, grouping), kernels_by_name(f.kernels), &pool);
  model.load(Checkpoint::open(dir, false));
  model.zero_grads();
  const double loss = model.forward_backward(ids.data(), 1, static_cast<int>(ids.size()), true);
  std::cout << nlohmann::json{{"loss", loss}, {"tokens", ids.size()}}.dump() << std::endl;
  if (!f.out.empty()) {
    std::vector<TensorToWrite> tensors;
    for (const TrainTensor& t : model.tensors()) {
      const std::span<const float> g = model.grads().subspan(t.offset, t.numel);
      tensors.push_back(
          {t.name, DType::F32, t.shape, {reinterpret_cast<const uint8_t*>(g.data()), g.size_bytes()}});
    }
    write_safetensors(f.out, tensors, {{"loss", std::to_string(loss)}});
  }
  return 0;
}

}  // namespace

Subcommand add_grad(CLI::App& parent) {
  auto f = std::make_shared<GradFlags>();
  CLI::App* grad = parent.add_subcommand(
      "grad", "the mean next-token loss of token ids (a JSON line) and its gradient for every parameter (safetensors)");
  grad->add_option("-m,--model", f->dir, "model directory (config.json + *.safetensors)")->required();
  grad->add_option("--ids", f->ids, "token ids: 1,2,3 or [1, 2, 3] (at least two)")->required();
  grad->add_option("--out", f->out, "write the gradients as float32 safetensors, under the checkpoint's tensor names");
  grad->add_option("--kernels", f->kernels, "kernel set: cpu (default) or ref (the slow scalar oracle)")
      ->check(CLI::IsMember({"cpu", "ref"}));
  grad->add_option("--mamba2-norm", f->mamba2_norm, "Mamba-2 gated norm: grouped (default) or full")
      ->check(CLI::IsMember({"grouped", "full"}));
  grad->add_option("-t,--threads", f->threads, "threads (default: all CPUs)")->check(CLI::PositiveNumber);
  return {grad, [f] { return cmd_grad(*f); }};
}

}  // namespace hybridlm
