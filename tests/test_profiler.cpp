// The built-in profiler (fsdp/core/profiler.hpp, train.profile_steps). Run under mpirun at 2
// ranks (the engine's collectives need two):
//  - Profiler and ProfileRange alone: the window (recording only in [first, last], end_step
//    true at last), ranges dropped outside it and with a null profiler, the trace file's
//    format (metadata naming "rank R", "CPU" and each "stream N" of a fake device
//    collector whose events land on their stream's tid, ts/dur in microseconds), one write.
//  - A 3-step GPT-2 FULL_SHARD run with profile_steps = [2, 3]: each rank's
//    profile/rank_R.trace.json holds "step 2" and "step 3" only; the phase ranges of a step
//    lie inside it and add up to it (and to the trainer's own step time); eval and
//    checkpoint appear in step 3 only; every collective range is nested inside one phase
//    range and names its unit by index and by the engine's name ("all_gather wait unit 1
//    (h.0)"), with the bytes it moves; the trainer's own collectives (loss, grad_norm, the
//    step agreement) are there on every step.
//  - NO_SHARD: the gradient all-reduces are named per unit; a window of one step.
//  - A run ending inside the window writes what it recorded; a window after the run's end
//    and a run without profile_steps write nothing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/core/error.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/profiler.hpp"
#include "fsdp/train/profiling.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/model.hpp"
#include "train_util.hpp"

using namespace test_util;
using fsdp::ActivityCollector;
using fsdp::ProfileRange;
using fsdp::Profiler;
using fsdp::TraceEvent;
using nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// The complete events ("ph": "X") of a trace.
std::vector<json> complete_events(const json& trace) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") out.push_back(e);
  }
  return out;
}

// Metadata "name" of (what, pid, tid) in a trace, "" if absent.
std::string meta_name(const json& trace, const std::string& what, int64_t pid, int64_t tid = -1) {
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == what && e.at("pid") == pid &&
        (tid < 0 || (e.contains("tid") && e.at("tid") == tid))) {
      return e.at("args").at("name").get<std::string>();
    }
  }
  return "";
}

double end_of(const json& e) { return e.at("ts").get<double>() + e.at("dur").get<double>(); }

// Device activity that a test hands in: stop() appends a kernel and a copy starting at
// *kernel_ns, and a kernel "warm_up_kernel" starting 1 ns after start() was called.
class FakeCollector final : public ActivityCollector {
 public:
  FakeCollector(int* starts, const int64_t* kernel_ns) : starts_(starts), kernel_ns_(kernel_ns) {}
  void start() override {
    ++*starts_;
    started_ns_ = Profiler::now_ns();
  }
  void stop(std::vector<TraceEvent>& out) override {
    TraceEvent k;
    k.name = "warm_up_kernel";
    k.cat = "kernel";
    k.start_ns = started_ns_ + 1;
    k.dur_ns = 10;
    k.stream = 7;
    out.push_back(k);
    k.name = "gemm_kernel";
    k.start_ns = *kernel_ns_;
    k.dur_ns = 2'500;
    k.args.push_back({"grid", std::vector<int64_t>{4, 2, 1}});
    out.push_back(k);
    k.name = "Memcpy DtoH (Device -> Pinned)";
    k.cat = "gpu_memcpy";
    k.stream = 13;
    k.args = {{"bytes", int64_t{8}}};
    out.push_back(k);
  }
  int64_t dropped_records() const override { return 3; }

 private:
  int* starts_;
  const int64_t* kernel_ns_;
  int64_t started_ns_ = 0;
};

TEST(Profiler, WindowRangesAndTraceFormat) {
  const std::string dir = fresh_dir("unit") + "/rank" + std::to_string(world_rank());
  const std::string path = dir + "/profile/trace.json";
  int starts = 0;
  int64_t kernel_ns = 0;  // set inside the window below
  Profiler p(2, 3, 5, path, std::make_unique<FakeCollector>(&starts, &kernel_ns));
  {
    ProfileRange none(nullptr, "collective", "nothing");
    EXPECT_FALSE(none);
  }
  EXPECT_FALSE(p.recording());
  p.begin_step(1);
  EXPECT_FALSE(p.recording());
  {
    ProfileRange outside(&p, "collective", "before the window");
    EXPECT_FALSE(outside);
  }
  EXPECT_EQ(starts, 0);
  EXPECT_FALSE(p.end_step());
  EXPECT_EQ(starts, 1);  // the warm-up: started at the end of the step before the window
  p.begin_step(2);
  EXPECT_TRUE(p.recording());
  EXPECT_EQ(starts, 1);
  const int64_t t0 = Profiler::now_ns();
  kernel_ns = t0 + 123;
  {
    ProfileRange r(&p, "collective");
    ASSERT_TRUE(r);
    r.name("all_gather wait unit 1 (h.0)").arg("bytes", int64_t{4096}).arg("dtype", "bf16");
  }
  {
    ProfileRange issue(&p, "collective", "all_reduce issue loss");
    issue.end();
    EXPECT_FALSE(issue);
  }
  const int64_t t1 = Profiler::now_ns();
  EXPECT_FALSE(p.end_step());
  p.begin_step(3);
  EXPECT_EQ(starts, 1);  // started once
  EXPECT_TRUE(p.end_step());
  EXPECT_FALSE(p.recording());
  EXPECT_TRUE(p.write());
  EXPECT_TRUE(p.written());
  EXPECT_FALSE(p.write());  // once
  p.begin_step(3);
  EXPECT_FALSE(p.recording());  // nothing after the write

  const json t = read_json(path);
  EXPECT_EQ(t.at("displayTimeUnit"), "ms");
  EXPECT_EQ(t.at("otherData").at("profile_steps"), json({2, 3}));
  EXPECT_EQ(t.at("otherData").at("device_records_dropped"), 3);
  EXPECT_EQ(meta_name(t, "process_name", 5), "rank 5");
  EXPECT_EQ(meta_name(t, "thread_name", 5, 7), "stream 7");
  EXPECT_EQ(meta_name(t, "thread_name", 5, 13), "stream 13");
  const std::vector<json> events = complete_events(t);
  ASSERT_EQ(events.size(), 4u);  // the warm-up's kernel (before step 2) is dropped
  std::map<std::string, json> by_name;
  for (const json& e : events) by_name[e.at("name").get<std::string>()] = e;
  const json& wait = by_name.at("all_gather wait unit 1 (h.0)");
  EXPECT_EQ(wait.at("cat"), "collective");
  EXPECT_EQ(wait.at("pid"), 5);
  EXPECT_EQ(meta_name(t, "thread_name", 5, wait.at("tid").get<int64_t>()), "CPU");
  EXPECT_EQ(wait.at("args").at("bytes"), 4096);
  EXPECT_EQ(wait.at("args").at("dtype"), "bf16");
  // Microseconds of the steady clock, inside the interval that bracketed the range.
  EXPECT_GE(wait.at("ts").get<double>(), t0 / 1e3 - 1e-3);
  EXPECT_LE(end_of(wait), t1 / 1e3 + 1e-3);
  EXPECT_EQ(by_name.at("all_reduce issue loss").at("cat"), "collective");
  const json& kernel = by_name.at("gemm_kernel");
  EXPECT_EQ(kernel.at("tid"), 7);
  EXPECT_EQ(kernel.at("cat"), "kernel");
  EXPECT_DOUBLE_EQ(kernel.at("ts").get<double>(), static_cast<double>(t0 + 123) / 1e3);
  EXPECT_DOUBLE_EQ(kernel.at("dur").get<double>(), 2.5);
  EXPECT_EQ(kernel.at("args").at("grid"), json({4, 2, 1}));
  EXPECT_EQ(by_name.at("Memcpy DtoH (Device -> Pinned)").at("tid"), 13);
  // Sorted by start time.
  double prev = -1;
  for (const json& e : events) {
    EXPECT_GE(e.at("ts").get<double>(), prev);
    prev = e.at("ts").get<double>();
  }
}

TEST(Profiler, WindowNeverReachedWritesNothing) {
  const std::string dir = fresh_dir("unit_none") + "/rank" + std::to_string(world_rank());
  int starts = 0;
  const int64_t kernel_ns = Profiler::now_ns();
  {
    Profiler p(4, 6, 0, dir + "/trace.json", std::make_unique<FakeCollector>(&starts, &kernel_ns));
    for (int s = 1; s <= 3; ++s) {
      p.begin_step(s);
      EXPECT_FALSE(p.end_step());
      EXPECT_EQ(starts, s == 3 ? 1 : 0);  // step 3's end is the warm-up for step 4
    }
    EXPECT_FALSE(p.write());  // stops the collector; no step of the window ran
  }
  EXPECT_EQ(starts, 1);
  EXPECT_FALSE(fs::exists(dir + "/trace.json"));
}

// unit index -> the engine's name of the unit for config `c` on this world.
std::vector<std::string> unit_names(const Config& c) {
  std::vector<std::string> names;
  const auto modules = fsdp::model_family(c.model.type).modules(c.model);
  for (const auto& l : fsdp::build_unit_layouts(modules, c.fsdp, world_size())) {
    names.push_back(l.unit_name);
  }
  return names;
}

std::string trace_path(const std::string& run_dir) {
  return run_dir + "/profile/rank_" + std::to_string(world_rank()) + ".trace.json";
}

const std::set<std::string> kPhases = {"data",      "forward", "backward", "comm_wait",
                                       "optimizer", "eval",    "checkpoint"};

// Checks of one rank's trace of `steps` (nested ranges, phases tiling each step, collective
// names); returns the collective ranges' names by step.
std::map<int64_t, std::multiset<std::string>> check_trace(const json& trace,
                                                           const std::vector<int64_t>& steps,
                                                           const std::vector<std::string>& units) {
  const int rank = world_rank();
  EXPECT_EQ(meta_name(trace, "process_name", rank), "rank " + std::to_string(rank));
  const std::vector<json> events = complete_events(trace);
  std::map<int64_t, json> step_of;  // step -> its "step N" range
  for (const json& e : events) {
    EXPECT_EQ(e.at("pid"), rank);
    if (e.at("cat") == "step") {
      const int64_t n = e.at("args").at("step").get<int64_t>();
      EXPECT_EQ(e.at("name"), "step " + std::to_string(n));
      EXPECT_TRUE(step_of.emplace(n, e).second) << "two ranges of step " << n;
    }
  }
  std::vector<int64_t> seen;
  for (const auto& [n, _] : step_of) seen.push_back(n);
  EXPECT_EQ(seen, steps);

  const std::regex unit_re(R"(^(all_gather|reduce_scatter|all_reduce) (issue|wait) unit (\d+) \((.+)\)$)");
  std::map<int64_t, std::multiset<std::string>> collectives;
  std::vector<json> phases;
  for (const json& e : events) {
    if (e.at("cat") == "phase") phases.push_back(e);
  }
  for (const auto& [n, step] : step_of) {
    SCOPED_TRACE("step " + std::to_string(n));
    const double begin = step.at("ts").get<double>(), end = end_of(step);
    const int64_t tid = step.at("tid").get<int64_t>();
    double sum = 0, cursor = begin;
    int count = 0;
    for (const json& p : phases) {
      if (p.at("args").at("step") != n) continue;
      EXPECT_TRUE(kPhases.count(p.at("name").get<std::string>())) << p.at("name");
      EXPECT_EQ(p.at("tid"), tid);
      // Consecutive: each starts where the previous ended (to the nanosecond decimals).
      EXPECT_NEAR(p.at("ts").get<double>(), cursor, 2e-3);
      cursor = end_of(p);
      sum += p.at("dur").get<double>();
      ++count;
    }
    EXPECT_GE(count, 5);
    EXPECT_NEAR(sum, end - begin, 1e-3 * count + 1e-6 * (end - begin));
    EXPECT_NEAR(cursor, end, 2e-3);
    // Collectives: on the CPU track, each inside exactly one phase range of this step.
    for (const json& e : events) {
      if (e.at("cat") != "collective") continue;
      const double a = e.at("ts").get<double>(), b = end_of(e);
      if (a < begin - 1e-3 || b > end + 1e-3) continue;  // another step's
      EXPECT_EQ(e.at("tid"), tid);
      int inside = 0;
      for (const json& p : phases) {
        if (a >= p.at("ts").get<double>() - 1e-3 && b <= end_of(p) + 1e-3) ++inside;
      }
      EXPECT_EQ(inside, 1) << e.at("name") << " is not nested in one phase range";
      const std::string name = e.at("name").get<std::string>();
      collectives[n].insert(name);
      std::smatch m;
      if (std::regex_match(name, m, unit_re)) {
        const int unit = std::stoi(m[3]);
        if (unit >= static_cast<int>(units.size())) {
          ADD_FAILURE() << name << ": no unit " << unit;
          continue;
        }
        EXPECT_EQ(m[4].str(), units[unit]) << name;
        EXPECT_EQ(e.at("args").at("unit"), unit);
        EXPECT_EQ(e.at("args").at("unit_name"), units[unit]);
        EXPECT_GT(e.at("args").at("in_bytes").get<int64_t>(), 0) << name;
        EXPECT_GT(e.at("args").at("out_bytes").get<int64_t>(), 0) << name;
        EXPECT_EQ(e.at("args").at("ranks"), world_size());
      }
    }
  }
  return collectives;
}

std::set<std::string> phases_of_step(const json& trace, int64_t step) {
  std::set<std::string> out;
  for (const json& e : complete_events(trace)) {
    if (e.at("cat") == "phase" && e.at("args").at("step") == step) {
      out.insert(e.at("name").get<std::string>());
    }
  }
  return out;
}

TEST(ProfiledRun, Steps2And3OfAFullShardRun) {
  ASSERT_EQ(world_size(), 2) << "the collective checks are written for 2 ranks";
  const std::string dir = fresh_dir("full_shard");
  Config c = small_config(dir);
  c.train.max_steps = 3;
  c.train.profile_steps = {2, 3};
  c.fsdp.sharding_strategy = fsdp::ShardingStrategy::FULL_SHARD;
  c.eval.every = 0;        // evaluates at the end only
  c.checkpoint.every = 0;  // saves at the end only
  const TrainResult r = run(c, On::world);
  ASSERT_EQ(r.step_times.size(), 3u);
  const std::vector<std::string> units = unit_names(c);
  ASSERT_EQ(units, (std::vector<std::string>{"root", "h.0", "h.1"}));

  const json trace = read_json(trace_path(dir));
  const auto collectives = check_trace(trace, {2, 3}, units);
  // The trace's step ranges are the StepTimer's own marks: the trainer's step_s.
  for (const json& e : complete_events(trace)) {
    if (e.at("cat") != "step") continue;
    const int64_t n = e.at("args").at("step").get<int64_t>();
    EXPECT_NEAR(e.at("dur").get<double>(), 1e6 * r.step_times[n - 1].step_s, 1.0) << "step " << n;
  }
  EXPECT_EQ(phases_of_step(trace, 2).count("eval"), 0u);
  EXPECT_EQ(phases_of_step(trace, 2).count("checkpoint"), 1u);  // asks for a pending save
  EXPECT_EQ(phases_of_step(trace, 3).count("eval"), 1u);
  for (const char* p : {"data", "forward", "backward", "comm_wait", "optimizer"}) {
    EXPECT_EQ(phases_of_step(trace, 2).count(p), 1u) << p;
  }
  for (int64_t n : {2, 3}) {
    SCOPED_TRACE("step " + std::to_string(n));
    const auto& names = collectives.at(n);
    // Every unit is all-gathered (FULL_SHARD over 2 ranks) and reduce-scattered, issue and wait.
    for (std::size_t u = 0; u < units.size(); ++u) {
      const std::string label = " unit " + std::to_string(u) + " (" + units[u] + ")";
      for (const char* what : {"all_gather issue", "all_gather wait", "reduce_scatter issue",
                               "reduce_scatter wait"}) {
        EXPECT_GE(names.count(what + label), 1u) << what << label;
      }
    }
    if (n == 2) {  // (step 3 evaluates too, which gathers every unit once more)
      // Blocks are gathered again for backward (resharded after forward); the root is not.
      EXPECT_EQ(names.count("all_gather issue unit 1 (h.0)"), 2u);
      EXPECT_EQ(names.count("all_gather issue unit 0 (root)"), 1u);
    }
    for (const char* name : {"all_reduce issue loss", "all_reduce wait loss",
                             "all_gather issue grad_norm", "all_gather wait grad_norm",
                             "all_reduce step_agreement"}) {
      EXPECT_EQ(names.count(name), 1u) << name;
    }
  }
  // Step 3's evaluation pass gathers every unit inside its eval phase.
  std::set<std::string> eval_gathers;
  double eval_begin = 0, eval_end = 0;
  for (const json& e : complete_events(trace)) {
    if (e.at("cat") == "phase" && e.at("name") == "eval") {
      eval_begin = e.at("ts").get<double>();
      eval_end = end_of(e);
    }
  }
  for (const json& e : complete_events(trace)) {
    if (e.at("cat") == "collective" && e.at("ts").get<double>() >= eval_begin &&
        end_of(e) <= eval_end) {
      eval_gathers.insert(e.at("name").get<std::string>());
    }
  }
  EXPECT_TRUE(eval_gathers.count("all_gather wait unit 2 (h.1)"));
}

TEST(ProfiledRun, NoShardNamesItsAllReducesAndOneStepWindows) {
  const std::string dir = fresh_dir("no_shard");
  Config c = small_config(dir);
  c.train.max_steps = 2;
  c.train.profile_steps = {1, 1};
  c.fsdp.sharding_strategy = fsdp::ShardingStrategy::NO_SHARD;
  run(c, On::world);
  const std::vector<std::string> units = unit_names(c);
  const json trace = read_json(trace_path(dir));
  const auto collectives = check_trace(trace, {1}, units);
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::string label = " unit " + std::to_string(u) + " (" + units[u] + ")";
    EXPECT_EQ(collectives.at(1).count("all_reduce issue" + label), 1u) << label;
    EXPECT_EQ(collectives.at(1).count("all_reduce wait" + label), 1u) << label;
    EXPECT_EQ(collectives.at(1).count("all_gather issue" + label), 0u) << label;
  }
}

TEST(ProfiledRun, ARunEndingInsideTheWindowWritesWhatItRecorded) {
  const std::string dir = fresh_dir("cut_short");
  Config c = small_config(dir);
  c.train.max_steps = 3;
  c.train.profile_steps = {2, 9};
  run(c, On::world);
  check_trace(read_json(trace_path(dir)), {2, 3}, unit_names(c));
}

TEST(ProfiledRun, NothingWrittenOutsideTheWindowOrWhenOff) {
  const std::string late = fresh_dir("late");
  Config c = small_config(late);
  c.train.max_steps = 2;
  c.train.profile_steps = {3, 4};
  run(c, On::world);
  EXPECT_FALSE(fs::exists(trace_path(late)));
  const std::string off = fresh_dir("off");
  c = small_config(off);
  c.train.max_steps = 2;
  run(c, On::world);
  EXPECT_FALSE(fs::exists(off + "/profile"));
}


// Issue 29 item 2: the trace is a diagnostic, never worth the run. An unwritable profile
// directory is refused at start-up (as checkpoints/ is), naming train.profile_steps; a trace
// that cannot be written when the window ends (here run_dir/profile replaced by a file after
// step 1: ENOTDIR) is a warning, and the run trains to its last step and saves.
TEST(ProfiledRun, AnUnwritableProfileDirIsRefusedAtStartUp) {
  const std::string dir = fresh_dir("profile_is_a_file");
  if (world_rank() == 0) std::ofstream(dir + "/profile") << "not a directory";
  MPI_Barrier(MPI_COMM_WORLD);
  Config c = small_config(dir);
  c.train.max_steps = 2;
  c.train.profile_steps = {1, 2};
  try {
    run(c, On::world);
    ADD_FAILURE() << "a run with an unwritable profile directory started";
  } catch (const fsdp::Error& e) {
    // Every rank stops with exit 2; the line naming the key is the failing rank's (the
    // others learn that a peer failed).
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError) << e.what();
    if (world_rank() == 0) {
      EXPECT_NE(std::string(e.what()).find("train.profile_steps"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/latest"));
}

TEST(ProfiledRun, AFailedTraceWriteIsAWarningAndTheRunGoesOn) {
  const std::string dir = fresh_dir("trace_write_fails");
  Config c = small_config(dir);
  c.train.max_steps = 5;
  c.train.profile_steps = {2, 3};
  fsdp::TrainOptions o;
  int calls = 0;
  o.pending_signal = [&] {
    if (++calls == 1) {  // the first step boundary, on every rank
      MPI_Barrier(MPI_COMM_WORLD);
      if (world_rank() == 0) {
        fs::remove_all(dir + "/profile");
        std::ofstream(dir + "/profile") << "not a directory";
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    return 0;
  };
  const TrainResult r = run(c, On::world, 0, false, o);
  EXPECT_EQ(r.final_step, 5);
  EXPECT_EQ(r.losses.size(), 5u);
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/latest")) << "the run saved its final checkpoint";
  EXPECT_FALSE(fs::exists(trace_path(dir)));
}

// Issue 29 item 7: after a resume, a window before the resumed run's first step says so
// instead of only "no step ran".
TEST(Profiler, AWindowBeforeAResumedRunSaysSo) {
  const std::string dir = fresh_dir("unit_resumed") + "/rank" + std::to_string(world_rank());
  fsdp::MpiCommunicator self(MPI_COMM_SELF);
  std::vector<std::string> lines;
  auto log = [&](const std::string& line) { lines.push_back(line); };
  {
    Profiler p(3, 5, 0, dir + "/trace.json");
    for (int s = 11; s <= 20; ++s) {  // resumed at step 10
      p.begin_step(s);
      p.end_step();
    }
    EXPECT_EQ(p.first_step_begun(), 11);
    fsdp::write_profile(p, self, dir, 20, log);
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "profile: no step of train.profile_steps = [3, 5] ran (this run resumed at "
                      "step 10 and ran steps 11-20); no trace written");
  lines.clear();
  {
    Profiler p(8, 9, 0, dir + "/trace2.json");  // a fresh run that ended before the window
    for (int s = 1; s <= 5; ++s) {
      p.begin_step(s);
      p.end_step();
    }
    fsdp::write_profile(p, self, dir, 5, log);
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "profile: no step of train.profile_steps = [8, 9] ran (the run ended at "
                      "step 5); no trace written");
}

}  // namespace
