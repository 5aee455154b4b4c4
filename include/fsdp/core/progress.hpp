// fsdp/core/progress.hpp: a one-line progress meter for the tools that work through a large
// corpus or model (fsdp_prepare: input bytes read; fsdp_merge: tensors and bytes written).
//
// On a terminal the meter keeps ONE status line on stderr, rewritten in place: each update
// writes "\r" + the line + "\033[K" (ANSI erase to end of line, so a shorter line leaves no
// tail of the longer one before it), at most once per `min_interval_s` (0.25 s: ~4 updates a
// second). The first update, and the one that reaches the total, draw at once; nothing is
// drawn before the first update. finish() writes the final state and a newline, once.
// Three shapes of line (format_progress_line):
//
//   fsdp_prepare: 12.3 MiB / 45.6 MiB (26%), 4.1 MiB/s, ETA 8s                 bytes
//   fsdp_merge: 12 / 40 tensors, 34.0 MiB / 42.0 MiB (80%), 12.3 MiB/s, ETA 1s   items with bytes
//   label: 12 / 40 files (30%), 2.5 files/s, ETA 11s                            items alone
//
// A meter given no output (nullptr; ProgressMeter::on_terminal when stderr is not a TTY)
// writes nothing at all, so piped or redirected output is exactly what it would be without
// one. Library functions take an optional `ProgressMeter*` (default none) and only call
// set_total / add / update on it; the tool that owns the meter decides where it prints and
// calls finish() before printing its own summary.
//
// Thread-safety: none. One thread drives a meter (the tools call it from their one working
// thread); it writes to its stream without locking.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

namespace fsdp {

enum class ProgressUnit {
  kBytes,  // done / total are bytes: "12.3 MiB / 45.6 MiB"
  kItems,  // done / total count items named by ProgressSpec::noun: "12 / 40 tensors"
};

// What a meter measures; fixed for its life except the totals (ProgressMeter::set_total).
struct ProgressSpec {
  std::string label;                         // first word of the line: "fsdp_prepare"
  ProgressUnit unit = ProgressUnit::kBytes;
  std::string noun = "items";                // kItems: what is counted ("tensors")
  int64_t total = 0;                         // in `unit`; 0: nothing to do (shown as 100%)
  int64_t total_bytes = 0;                   // kItems: the bytes the items amount to, when
                                             // known (> 0): then the line also shows bytes,
                                             // and %, rate and ETA follow bytes, not items
};


// A duration rounded to whole seconds: "8s", "1m05s", "2h03m" (hours and minutes from one
// hour on); "--" for a negative or non-finite value.
std::string format_duration(double seconds);

// One status line (no "\r", escape code or newline) for `done` units (and `bytes` bytes,
// read for kItems with total_bytes > 0 only) after `elapsed_s` seconds:
//  - percent: floor(100 * fraction), fraction = done / total (bytes / total_bytes for items
//    with bytes), clamped to [0, 1]; 100% when the total is 0;
//  - rate: bytes (kBytes: done) per second in MiB/s with one decimal, or items per second
//    ("2.5 tensors/s") for items without bytes; "--" until something is done and time has
//    passed (elapsed_s > 0);
//  - ETA: elapsed_s * (1 - fraction) / fraction, format_duration; "ETA 0s" once the fraction
//    is 1, "ETA --" while the rate is unknown.
// Pure: the same arguments give the same string (unit-tested exactly).
std::string format_progress_line(const ProgressSpec& spec, int64_t done, int64_t bytes, double elapsed_s);

class ProgressMeter {
 public:
  // Seconds from any fixed origin, never decreasing (tests inject a fake one).
  using Clock = std::function<double()>;
  static double steady_seconds();  // std::chrono::steady_clock, the default clock

  // A meter writing to `out` (nullptr: disabled, writes nothing). The clock starts now.
  ProgressMeter(ProgressSpec spec, std::ostream* out, Clock clock = steady_seconds,
                double min_interval_s = 0.25);
  // The meter the tools use: writes to std::cerr if isatty(STDERR_FILENO), else disabled.
  static ProgressMeter on_terminal(ProgressSpec spec);

  // Finishes the line (finish()); never throws. Not copyable nor movable (on_terminal
  // returns a prvalue: `auto m = ProgressMeter::on_terminal(...)` needs no move).
  ~ProgressMeter();
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  bool enabled() const { return out_ != nullptr; }
  const ProgressSpec& spec() const { return spec_; }
  int64_t done() const { return done_; }
  int64_t bytes() const { return bytes_; }

  // Sets the totals once the work is known (a library function that finds them itself:
  // fsdp_prepare's input size, fsdp_merge's tensor count) and restarts the clock, so the
  // rate measures the work and not what came before it. Prints nothing.
  void set_total(int64_t total, int64_t total_bytes = 0);

  // Sets the progress to `done` units (and `bytes` bytes; ignored for kBytes, where bytes
  // are `done`) and rewrites the line if none was written yet, if min_interval_s has passed
  // since the last one, or if the total (total_bytes for items with bytes) is reached for
  // the first time: then the clock is also frozen for the line, so while the tool finishes
  // up (writes its output file) the line shows 100% and the rate of the measured work.
  // add() adds to the current values. Cheap when disabled (no clock read) and when
  // throttled (one clock read).
  void update(int64_t done, int64_t bytes = 0);
  void add(int64_t delta, int64_t delta_bytes = 0);

  // Rewrites the line with the current values (the last update may have been throttled)
  // and ends it with a newline; once (later calls, and the destructor after it, do
  // nothing). Writes nothing when disabled or when no line was written yet (no update or
  // add since construction: e.g. the work failed before it started, so an error message
  // is not preceded by an empty "0 / 0" line).
  void finish();

 private:
  void draw(double now, bool final_line);  // writes the line for the current values

  ProgressSpec spec_;
  std::ostream* out_;
  Clock clock_;
  double min_interval_s_;
  double start_ = 0;
  double last_draw_ = 0;
  int64_t done_ = 0, bytes_ = 0;
  double complete_at_ = 0;  // when the total was reached (complete_)
  bool complete_ = false;
  bool drawn_ = false;     // a line has been written (last_draw_ is valid)
  bool finished_ = false;
};

}  // namespace fsdp
