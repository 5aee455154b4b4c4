// fsdp/train/trainer.hpp: the training loop of fsdp_train.
//
// One call runs a whole job on the ranks of `world`: builds the backend, the DeviceMesh, the
// data pipeline, the model and the FSDP engine; optionally resumes from
// run_dir/checkpoints/latest; trains train.max_steps steps (forward, backward with gradient
// reduction, global-norm clipping, optimizer step on the shards, LR schedule); evaluates
// every eval.every steps and at the end; checkpoints every checkpoint.every steps and at the
// end; logs on rank 0 and to run_dir/metrics.jsonl.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "fsdp/config/config.hpp"

namespace fsdp {

struct TrainOptions {
  bool resume = false;        // continue from run_dir/checkpoints/latest
  bool dry_run = false;       // validate, build mesh and units, print the memory plan, stop
  bool gather_params = false; // fill TrainResult::params with the final full parameters
  bool quiet = false;         // no log lines on stdout (tests)
  int64_t stop_after = 0;     // > 0: stop after this step as if killed (tests of resume);
                              // the LR schedule still follows train.max_steps
};

struct TrainResult {
  std::vector<double> losses;                          // train loss of each step run, nats
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss)
  std::map<std::string, std::vector<float>> params;    // name -> full fp32 values (if asked)
  int64_t final_step = 0;
  int64_t num_params = 0;
};

// Runs the job. Collective over `world`. `out` receives rank 0's log lines.
// Throws fsdp::Error (exit code 2 for bad input, on every rank, via collective_guard) or
// PeerFailed on ranks whose peer failed.
TrainResult train(const Config& config, MPI_Comm world, const TrainOptions& options,
                  std::ostream& out);

}  // namespace fsdp
