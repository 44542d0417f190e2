// `hybridlm train --config train.yaml [--resume]`: train a block-pattern model (docs/training.md).
#include <malloc.h>

#include <memory>

#include "train/dist.h"
#include "train/trainer.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

struct TrainFlags {
  std::string config;
  TrainRunOptions run;
};

int cmd_train(const TrainFlags& f) {
  // Training allocates its large temporaries per step: keep freed memory in the heap instead of
  // giving it back to the kernel (glibc maps blocks over 128 KiB and unmaps them on free), so that
  // each step does not pay a page fault per 4 KiB of every temporary again.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  Dist dist(nullptr, nullptr);
  try {
    run_training(load_train_config(f.config), f.run, dist);
  } catch (const std::exception& e) {
    if (dist.size() > 1) dist.abort_all(e.what());  // the other ranks may wait in a collective
    throw;
  }
  return 0;
}

}  // namespace

Subcommand add_train(CLI::App& parent) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* train = parent.add_subcommand(
      "train", "train a block-pattern model from train.yaml (under mpirun: data parallel over the ranks)");
  train->add_option("-c,--config", f->config, "the run's train.yaml (docs/training.md)")->required();
  train->add_flag("--resume", f->run.resume, "continue from the latest checkpoint in the config's out directory");
  train->add_flag("-q,--quiet", f->run.quiet, "no progress lines");
  // For the tests: stop after N steps of this process as if killed (no final checkpoint).
  train->add_option("--stop-after", f->run.stop_after)->group("");
  return {train, [f] { return cmd_train(*f); }};
}

}  // namespace hybridlm
