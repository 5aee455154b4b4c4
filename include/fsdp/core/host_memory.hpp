// fsdp/core/host_memory.hpp: how much host memory this process can still use, read before
// anything large is allocated (the trainer compares it with the memory plan).
//
// Two limits apply on a Linux node and the smaller wins:
//  - the kernel's estimate of memory available without swapping, /proc/meminfo MemAvailable
//    (what `free` prints as "available");
//  - the control group's limit (Slurm's ConstrainRAMSpace, Docker --memory), minus what the
//    group already uses, plus its reclaimable page cache (inactive_file). cgroup v2
//    (memory.max, memory.current, memory.stat) or v1 (memory.limit_in_bytes,
//    memory.usage_in_bytes, memory.stat total_inactive_file) under /sys/fs/cgroup. A limit of
//    "max" or >= 2^60 bytes means none.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

struct HostMemory {
  int64_t mem_available = -1;   // MemAvailable in bytes; -1 if unknown
  int64_t cgroup_limit = -1;    // the cgroup's memory limit in bytes; -1 if none or unknown
  int64_t cgroup_usage = -1;    // bytes the cgroup uses (page cache included); -1 if unknown
  int64_t cgroup_reclaimable = 0;  // its inactive file pages in bytes (reclaimable)
  // Bytes this process can still allocate: the smaller of MemAvailable and
  // cgroup_limit - cgroup_usage + cgroup_reclaimable (clamped at 0); -1 when neither is known.
  int64_t available() const;
  // "MemAvailable 22.5 GiB" or "cgroup limit 8.0 GiB, 6.1 GiB used", the limit that applies.
  std::string describe() const;
};

// MemAvailable of a /proc/meminfo text, in bytes ("MemAvailable:   23555888 kB"); -1 if the
// line is missing or malformed. Never throws.
int64_t parse_mem_available(const std::string& meminfo);

// The value of `key` in a cgroup memory.stat text ("inactive_file 123"), bytes; 0 if absent.
int64_t parse_memory_stat(const std::string& stat, const std::string& key);

// Reads /proc/meminfo and the process's cgroup files. Missing files leave fields at -1.
// Never throws.
HostMemory read_host_memory();

// "1.5 GiB", "512 B": bytes in binary units, one decimal (messages, the memory plan, progress
// lines); the next unit where one decimal would round to 1024.0 ("1.0 MiB", not "1024.0 KiB").
std::string human_bytes(double bytes);

}  // namespace fsdp
