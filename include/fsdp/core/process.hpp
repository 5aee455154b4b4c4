// fsdp/core/process.hpp: who this process is, for messages: its host name and its rank in
// the job, without asking MPI (core knows no MPI; the Runtime tells it the rank once MPI is
// up). Used by every "rank R on HOST" in an error line (CUDA/NCCL checks, the watchdog, the
// run directory's lock).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace fsdp {

// This machine's host name (gethostname; "unknown-host" if it fails).
std::string host_name();

// Records this process's world rank (the Runtime, after MPI_Init). Thread-safe.
void set_world_rank(int rank);

// This process's world rank: the one set_world_rank recorded, else the launcher's
// environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID, in that order: what
// mpirun or srun exported before MPI_Init), else -1 (unknown). Never throws.
int world_rank() noexcept;

// "rank R on HOST" ("rank ? on HOST" when the rank is unknown).
std::string where();

// Seconds since this process started (its start time in /proc/self/stat against
// /proc/uptime, clock-tick resolution: 10 ms), or -1 where /proc cannot tell. Never throws.
double seconds_since_process_start() noexcept;

// CPUs the calling thread may run on (sched_getaffinity: the rank's own cores once the
// Runtime has bound them), at least 1. Never throws.
int usable_cpus() noexcept;

// Runs part(0) .. part(parts - 1) and returns when all are done: each on a thread of its own
// where one can be started, part(0) and any part no thread could be started for on the
// calling thread. For first-touch fills of large host arrays (a shard's initial values,
// page-locked blocks). part must not throw.
void run_parts(int64_t parts, const std::function<void(int64_t)>& part);

}  // namespace fsdp
