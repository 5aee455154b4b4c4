// The profiler's window, host ranges and Chrome trace writer (see fsdp/core/profiler.hpp).
#include "fsdp/core/profiler.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/build_info.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

nlohmann::json to_json(const std::vector<TraceArg>& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const TraceArg& a : args) std::visit([&](const auto& v) { j[a.key] = v; }, a.value);
  return j;
}

// Microseconds with the nanoseconds as decimals (the trace format's unit).
double us(int64_t ns) { return static_cast<double>(ns) / 1e3; }

// The metadata event naming a process or thread ("ph": "M").
nlohmann::json meta(const char* what, int pid, const int64_t* tid, const nlohmann::json& args) {
  nlohmann::json j = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", args}};
  if (tid) j["tid"] = *tid;
  return j;
}

}  // namespace

int64_t Profiler::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Profiler::Profiler(int64_t first, int64_t last, int rank, std::string path,
                   std::unique_ptr<ActivityCollector> device)
    : first_(first),
      last_(last),
      rank_(rank),
      path_(std::move(path)),
      device_(std::move(device)),
      host_tid_(static_cast<int64_t>(::syscall(SYS_gettid))) {
  if (first_ < 1 || last_ < first_) {
    throw Error("Profiler: bad window [" + std::to_string(first_) + ", " + std::to_string(last_) + "]");
  }
}

Profiler::~Profiler() {
  try {
    write();
  } catch (...) {
  }
}

void Profiler::begin_step(int64_t step) {
  step_ = step;
  if (first_step_begun_ == 0) first_step_begun_ = step;
  recording_ = !written_ && step >= first_ && step <= last_;
  if (recording_) {
    if (steps_recorded_ == 0) window_start_ns_ = now_ns();
    ++steps_recorded_;
    start_device();  // first == 1: no step before the window to warm up in
  }
}

bool Profiler::end_step() {
  const bool due = recording_ && step_ == last_;
  recording_ = false;
  if (!written_ && step_ + 1 == first_) start_device();  // the warm-up: see the header
  return due;
}

void Profiler::start_device() {
  if (!device_ || device_started_) return;
  device_->start();
  device_started_ = true;
}

void Profiler::add(TraceEvent event) {
  if (recording_) events_.push_back(std::move(event));
}

bool Profiler::write() {
  if (written_) return false;
  written_ = true;
  recording_ = false;
  if (device_started_) {
    const std::size_t host_events = events_.size();
    device_->stop(events_);
    // The warm-up's activity (before the window's first step began) is not the window's.
    events_.erase(std::remove_if(events_.begin() + static_cast<std::ptrdiff_t>(host_events),
                                 events_.end(),
                                 [&](const TraceEvent& e) { return e.start_ns < window_start_ns_; }),
                  events_.end());
  }
  if (steps_recorded_ == 0) return false;

  // Longer events first among those starting together, so a viewer nests a phase inside
  // the step that starts with it.
  std::stable_sort(events_.begin(), events_.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.dur_ns > b.dur_ns;
  });
  nlohmann::json trace_events = nlohmann::json::array();
  trace_events.push_back(meta("process_name", rank_, nullptr, {{"name", "rank " + std::to_string(rank_)}}));
  trace_events.push_back(meta("process_sort_index", rank_, nullptr, {{"sort_index", rank_}}));
  trace_events.push_back(meta("thread_name", rank_, &host_tid_, {{"name", "CPU"}}));
  trace_events.push_back(meta("thread_sort_index", rank_, &host_tid_, {{"sort_index", 0}}));
  std::map<int64_t, bool> streams;
  for (const TraceEvent& e : events_) {
    if (e.stream >= 0) streams[e.stream] = true;
  }
  for (const auto& [s, _] : streams) {
    trace_events.push_back(meta("thread_name", rank_, &s, {{"name", "stream " + std::to_string(s)}}));
    trace_events.push_back(meta("thread_sort_index", rank_, &s, {{"sort_index", 1 + s}}));
  }
  for (const TraceEvent& e : events_) {
    trace_events.push_back({{"ph", "X"},
                            {"cat", e.cat},
                            {"name", e.name},
                            {"pid", rank_},
                            {"tid", e.stream >= 0 ? e.stream : host_tid_},
                            {"ts", us(e.start_ns)},
                            {"dur", us(e.dur_ns)},
                            {"args", to_json(e.args)}});
  }
  const nlohmann::json doc = {
      {"schemaVersion", 1},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"program", std::string("fsdp_train ") + build_id()},
        {"rank", rank_},
        {"profile_steps", {first_, last_}},
        {"steps_recorded", steps_recorded_},
        {"clock", "steady_clock (CLOCK_MONOTONIC), microseconds"},
        {"device_records_dropped", device_ ? device_->dropped_records() : 0}}},
      {"traceEvents", std::move(trace_events)}};
  events_.clear();
  events_.shrink_to_fit();
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error(dir.string() + ": cannot create directory: " + ec.message());
  }
  write_file_atomically(path_, doc.dump() + "\n");
  return true;
}

ProfileRange& ProfileRange::name(std::string name) {
  name_ = std::move(name);
  return *this;
}

ProfileRange& ProfileRange::arg(std::string key, int64_t value) {
  args_.push_back({std::move(key), value});
  return *this;
}

ProfileRange& ProfileRange::arg(std::string key, std::string value) {
  args_.push_back({std::move(key), std::move(value)});
  return *this;
}

void ProfileRange::finish() noexcept {
  try {
    const int64_t end = Profiler::now_ns();
    TraceEvent e;
    e.name = name_.empty() ? std::string(static_name_) : std::move(name_);
    e.cat = cat_;
    e.start_ns = start_ns_;
    e.dur_ns = end - start_ns_;
    e.args = std::move(args_);
    profiler_->add(std::move(e));
  } catch (...) {  // out of memory: the range is dropped
  }
}

}  // namespace fsdp
