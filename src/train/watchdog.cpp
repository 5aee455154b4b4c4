// The peer watchdog of blocking MPI waits (see fsdp/train/watchdog.hpp).
#include "fsdp/train/watchdog.hpp"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "fsdp/train/signals.hpp"

namespace fsdp {

namespace {
// /proc/<pid>/stat's fields after "pid (comm)" (comm may hold spaces and parentheses, so
// they start after the last ')'): [0] the state, ... [19] the start time. Empty if none.
std::vector<std::string> stat_fields(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::vector<std::string> fields;
  if (!in || !std::getline(in, line)) return fields;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 1));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}
}  // namespace

int64_t process_start_time(int64_t pid) {
  const std::vector<std::string> f = stat_fields(pid);
  if (f.size() < 20) return -1;
  try {
    return std::stoll(f[19]);
  } catch (...) {
    return -1;
  }
}

ProcessState local_process_state(int64_t pid, int64_t start_time) {
  const std::vector<std::string> f = stat_fields(pid);
  if (f.empty() || f[0].empty()) return ProcessState::exited;
  if (start_time >= 0 && f.size() >= 20 && f[19] != std::to_string(start_time)) {
    return ProcessState::exited;  // the pid now belongs to another process
  }
  switch (f[0][0]) {
    case 'T':
    case 't': return ProcessState::stopped;
    case 'Z':
    case 'X': return ProcessState::exited;
    default: return ProcessState::running;
  }
}

const char* const PeerWatch::kQuiet = "(quiet)";

PeerWatch::PeerWatch(int rank, std::vector<PeerInfo> peers, double timeout_s,
                     std::function<void(const std::string&)> fail)
    : rank_(rank), peers_(std::move(peers)), timeout_s_(timeout_s), fail_(std::move(fail)) {
  const std::string& me = peers_[static_cast<std::size_t>(rank_)].host;
  for (const PeerInfo& p : peers_) {
    visible_.push_back(p.host == me && p.start_time >= 0 &&
                       process_start_time(p.pid) == p.start_time);
  }
}

std::string PeerWatch::diagnose(const char* what, double waited_s) const {
  const std::string& me = peers_[static_cast<std::size_t>(rank_)].host;
  std::vector<int> stopped, exited, remote;
  bool hidden_local = false;   // a rank of this host name that /proc does not show
  bool lower_running = false;  // a running rank of this host with a smaller number
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == rank_) continue;
    const PeerInfo& p = peers_[static_cast<std::size_t>(r)];
    if (!visible_[static_cast<std::size_t>(r)]) {
      remote.push_back(r);
      hidden_local = hidden_local || p.host == me;
      continue;
    }
    switch (local_process_state(p.pid, p.start_time)) {
      case ProcessState::stopped: stopped.push_back(r); break;
      case ProcessState::exited: exited.push_back(r); break;
      case ProcessState::running: lower_running = lower_running || r < rank_; break;
    }
  }
  const bool timed_out = waited_s >= timeout_s_;
  // A rank exited and this one has a stop signal pending: mpirun is tearing the job down
  // (it SIGTERMs the survivors of a dead rank); it has said which rank died.
  if (!exited.empty() && pending_signal() != 0) return kQuiet;
  if (!exited.empty()) {
    // Measured on this wait's clock; a new wait (a smaller waited_s) starts the grace again.
    if (exited_seen_s_ < 0 || waited_s < exited_seen_s_) exited_seen_s_ = waited_s;
    if (waited_s - exited_seen_s_ < kExitGrace_s) return "";
  } else {
    if (!timed_out) return "";
    if (lower_running && waited_s < timeout_s_ + kReportGrace_s) return "";
  }
  std::ostringstream os;
  os << "rank " << rank_ << " (host " << me << "): " << what;
  if (timed_out) {
    os << " did not complete within comm.timeout_s = " << timeout_s_ << " s";
  } else {
    os << " still waiting after " << static_cast<double>(std::lround(waited_s * 10)) / 10.0 << " s";
  }
  auto name = [&](int r) {
    const PeerInfo& p = peers_[static_cast<std::size_t>(r)];
    std::ostringstream n;
    n << "rank " << r << " (host " << p.host << ", pid " << p.pid << ")";
    return n.str();
  };
  auto list = [&](const std::vector<int>& ranks, const char* one, const char* many) {
    os << (ranks.size() == 1 ? "" : "ranks ");
    for (std::size_t i = 0; i < ranks.size() && i < 8; ++i) {
      os << (i ? ", " : "");
      os << (ranks.size() == 1 ? name(ranks[i]) : name(ranks[i]).substr(5));
    }
    if (ranks.size() > 8) os << ", ...";
    os << " " << (ranks.size() == 1 ? one : many);
  };
  if (!exited.empty() || !stopped.empty()) {
    const char* sep = "; ";
    if (!exited.empty()) {
      os << sep;
      list(exited, "has exited", "have exited");
    }
    if (!stopped.empty()) {
      os << sep;
      list(stopped, "is stopped", "are stopped");
    }
  } else if (!remote.empty()) {
    os << (hidden_local ? "; ranks not visible in this host's /proc did not answer: "
                        : "; ranks on other hosts did not answer: ");
    for (std::size_t i = 0; i < remote.size() && i < 8; ++i) {
      const PeerInfo& p = peers_[static_cast<std::size_t>(remote[i])];
      os << (i ? ", " : "") << remote[i] << " (host " << p.host << ")";
    }
    if (remote.size() > 8) os << ", ...";
  } else {
    os << "; every other rank is running (busy, or waiting in a different collective)";
  }
  return os.str();
}

void PeerWatch::waiting(const char* what, double waited_s) noexcept {
  try {
    const std::string line = diagnose(what, waited_s);
    if (line == kQuiet) {
      fail_("");
    } else if (!line.empty()) {
      fail_(line);
    }
  } catch (...) {
    // Diagnosis is best effort (allocation, /proc): keep waiting; the next call retries.
  }
}

}  // namespace fsdp
