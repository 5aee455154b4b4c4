// The progress meter of fsdp_prepare and fsdp_merge (fsdp/core/progress.hpp), with an
// injected clock (no sleeps):
//  - human_bytes (fsdp/core/host_memory.hpp, which the line uses) / format_duration: unit
//    steps and rounding;
//  - format_progress_line: the exact line for bytes, items with bytes and items alone: MiB
//    and percent, rate, ETA ("--" before a rate is known, "0s" when done), a total of 0,
//    done == total and done > total;
//  - ProgressMeter: the first update draws at once, later ones at most once per interval,
//    each as "\r" + line + "\033[K", except the one reaching the total, drawn at once with
//    the time frozen there; finish() redraws the final values and writes the
//    newline exactly once (the destructor adds nothing after it, and ends an unfinished
//    line itself); set_total restarts the clock; a disabled meter writes nothing and never
//    reads the clock; on_terminal is enabled exactly when stderr is a TTY.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "fsdp/core/host_memory.hpp"
#include "fsdp/core/progress.hpp"

using fsdp::format_duration;
using fsdp::format_progress_line;
using fsdp::ProgressMeter;
using fsdp::ProgressSpec;
using fsdp::ProgressUnit;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

ProgressSpec bytes_spec(int64_t total) {
  return {.label = "fsdp_prepare", .unit = ProgressUnit::kBytes, .total = total};
}

ProgressSpec tensors_spec(int64_t total, int64_t total_bytes) {
  return {.label = "fsdp_merge", .unit = ProgressUnit::kItems, .noun = "tensors", .total = total,
          .total_bytes = total_bytes};
}

// "\r" + line + erase-to-end-of-line: one in-place redraw.
std::string redraw(const std::string& line) { return "\r" + line + "\033[K"; }

// A fake clock the test moves by hand; counts its reads.
struct FakeClock {
  double now = 0;
  int reads = 0;
  ProgressMeter::Clock fn() {
    return [this] {
      ++reads;
      return now;
    };
  }
};

}  // namespace

TEST(Progress, FormatBytes) {
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(0)), "0 B");
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(1023)), "1023 B");
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(1024)), "1.0 KiB");
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(5000)), "4.9 KiB");
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(kMiB - 1)), "1.0 MiB");  // 1023.999 KiB would print as 1024.0 KiB
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(12 * kMiB + 3 * kMiB / 10)), "12.3 MiB");
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(3 * 1024 * kMiB / 2)), "1.5 GiB");
  EXPECT_EQ(fsdp::human_bytes(static_cast<double>(int64_t{2} << 40)), "2.0 TiB");
}

TEST(Progress, FormatDuration) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(8.4), "8s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(59.6), "1m00s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(2 * 3600 + 3 * 60 + 30), "2h03m");
  EXPECT_EQ(format_duration(-1), "--");
  EXPECT_EQ(format_duration(std::nan("")), "--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "--");
}

TEST(Progress, LineBytes) {
  const ProgressSpec s = bytes_spec(40 * kMiB);
  EXPECT_EQ(format_progress_line(s, 10 * kMiB, 0, 2.0), "fsdp_prepare: 10.0 MiB / 40.0 MiB (25%), 5.0 MiB/s, ETA 6s");
  // `bytes` is ignored for kBytes: done is the byte count.
  EXPECT_EQ(format_progress_line(s, 10 * kMiB, 123, 2.0), format_progress_line(s, 10 * kMiB, 0, 2.0));
  // Nothing done yet, or no time passed: no rate, no ETA.
  EXPECT_EQ(format_progress_line(s, 0, 0, 0.0), "fsdp_prepare: 0 B / 40.0 MiB (0%), -- MiB/s, ETA --");
  EXPECT_EQ(format_progress_line(s, 0, 0, 3.0), "fsdp_prepare: 0 B / 40.0 MiB (0%), -- MiB/s, ETA --");
  EXPECT_EQ(format_progress_line(s, kMiB, 0, 0.0), "fsdp_prepare: 1.0 MiB / 40.0 MiB (2%), -- MiB/s, ETA --");
  // ETA in minutes: 1 MiB of 100 MiB in 1 s leaves 99 s.
  EXPECT_EQ(format_progress_line(bytes_spec(100 * kMiB), kMiB, 0, 1.0),
            "fsdp_prepare: 1.0 MiB / 100.0 MiB (1%), 1.0 MiB/s, ETA 1m39s");
  // Percent rounds down: 100% only when everything is done.
  EXPECT_EQ(format_progress_line(bytes_spec(1000), 999, 0, 1.0),
            "fsdp_prepare: 999 B / 1000 B (99%), 0.0 MiB/s, ETA 0s");
  EXPECT_EQ(format_progress_line(s, 40 * kMiB, 0, 5.0), "fsdp_prepare: 40.0 MiB / 40.0 MiB (100%), 8.0 MiB/s, ETA 0s");
  // More than the total (a file grew after it was measured): clamped to 100%.
  EXPECT_EQ(format_progress_line(s, 41 * kMiB, 0, 4.1), "fsdp_prepare: 41.0 MiB / 40.0 MiB (100%), 10.0 MiB/s, ETA 0s");
  // A total of 0: nothing to do is complete.
  EXPECT_EQ(format_progress_line(bytes_spec(0), 0, 0, 0.0), "fsdp_prepare: 0 B / 0 B (100%), -- MiB/s, ETA 0s");
  EXPECT_EQ(format_progress_line(bytes_spec(0), 0, 0, 2.0), "fsdp_prepare: 0 B / 0 B (100%), -- MiB/s, ETA 0s");
}

TEST(Progress, LineItemsWithBytes) {
  // Percent, rate and ETA follow bytes: 3 of 4 MiB is 75% although 12 of 40 tensors is 30%.
  const ProgressSpec s = tensors_spec(40, 4 * kMiB);
  EXPECT_EQ(format_progress_line(s, 12, 3 * kMiB, 3.0),
            "fsdp_merge: 12 / 40 tensors, 3.0 MiB / 4.0 MiB (75%), 1.0 MiB/s, ETA 1s");
  EXPECT_EQ(format_progress_line(s, 0, 0, 0.0), "fsdp_merge: 0 / 40 tensors, 0 B / 4.0 MiB (0%), -- MiB/s, ETA --");
  EXPECT_EQ(format_progress_line(s, 40, 4 * kMiB, 2.0),
            "fsdp_merge: 40 / 40 tensors, 4.0 MiB / 4.0 MiB (100%), 2.0 MiB/s, ETA 0s");
}

TEST(Progress, LineItemsAlone) {
  const ProgressSpec s{.label = "t", .unit = ProgressUnit::kItems, .noun = "files", .total = 40};
  EXPECT_EQ(format_progress_line(s, 10, 999, 4.0), "t: 10 / 40 files (25%), 2.5 files/s, ETA 12s");
  EXPECT_EQ(format_progress_line(s, 0, 0, 4.0), "t: 0 / 40 files (0%), -- files/s, ETA --");
  EXPECT_EQ(format_progress_line(s, 40, 0, 8.0), "t: 40 / 40 files (100%), 5.0 files/s, ETA 0s");
  const ProgressSpec empty{.label = "t", .unit = ProgressUnit::kItems, .noun = "files", .total = 0};
  EXPECT_EQ(format_progress_line(empty, 0, 0, 1.0), "t: 0 / 0 files (100%), -- files/s, ETA 0s");
}

TEST(Progress, MeterThrottlesAndFinishesOnce) {
  FakeClock clock;
  std::ostringstream out;
  const ProgressSpec s = bytes_spec(4 * kMiB);
  std::string want;
  {
    ProgressMeter m(s, &out, clock.fn(), 0.25);  // starts at t = 0
    EXPECT_TRUE(m.enabled());
    EXPECT_EQ(out.str(), "");  // nothing before the first update
    // Times are binary fractions, so the 0.25 s steps are exact.
    clock.now = 0.125;
    m.update(kMiB);  // the first update draws at once
    want += redraw(format_progress_line(s, kMiB, 0, 0.125));
    EXPECT_EQ(out.str(), want);
    clock.now = 0.25;
    m.add(kMiB);  // 0.125 s after the last line: throttled
    EXPECT_EQ(out.str(), want);
    EXPECT_EQ(m.done(), 2 * kMiB);
    clock.now = 0.3749;
    m.add(0);  // still under 0.25 s
    EXPECT_EQ(out.str(), want);
    clock.now = 0.375;
    m.add(kMiB);  // 0.25 s after the last line: drawn
    want += redraw(format_progress_line(s, 3 * kMiB, 0, 0.375));
    EXPECT_EQ(out.str(), want);
    clock.now = 0.4375;
    m.add(kMiB / 2);  // throttled; the last values a line showed stay 3 MiB
    EXPECT_EQ(out.str(), want);
    clock.now = 0.5;
    m.update(4 * kMiB);  // reaches the total: drawn at once, although 0.125 s after the last
    const std::string done_line = redraw("fsdp_prepare: 4.0 MiB / 4.0 MiB (100%), 8.0 MiB/s, ETA 0s");
    want += done_line;
    EXPECT_EQ(out.str(), want);
    clock.now = 2.0;  // the tool writes its output: the line keeps the rate of the work
    m.update(4 * kMiB);
    want += done_line;
    EXPECT_EQ(out.str(), want);
    clock.now = 3.0;
    m.finish();
    want += done_line + "\n";
    EXPECT_EQ(out.str(), want);
    // Once only: a second finish, later updates and the destructor add nothing.
    clock.now = 5;
    m.finish();
    m.update(kMiB);
    EXPECT_EQ(out.str(), want);
  }
  EXPECT_EQ(out.str(), want);
  EXPECT_EQ(std::count(want.begin(), want.end(), '\n'), 1);
}

TEST(Progress, DestructorEndsTheLine) {
  FakeClock clock;
  std::ostringstream out;
  const ProgressSpec s = tensors_spec(3, 300);
  {
    ProgressMeter m(s, &out, clock.fn());
    clock.now = 1;
    m.update(1, 100);
    clock.now = 1.1;
    m.update(2, 200);  // throttled: the destructor shows it (e.g. unwinding on an error)
  }
  EXPECT_EQ(out.str(),
            redraw(format_progress_line(s, 1, 100, 1.0)) + redraw(format_progress_line(s, 2, 200, 1.1)) + "\n");
}

TEST(Progress, NothingDrawnNothingFinished) {
  // No update before finish (the work failed before it started): no "0 / 0" line, no newline.
  FakeClock clock;
  std::ostringstream out;
  {
    ProgressMeter m(bytes_spec(10), &out, clock.fn());
    m.set_total(20);
    m.finish();
  }
  EXPECT_EQ(out.str(), "");
}

TEST(Progress, SetTotalRestartsTheClock) {
  FakeClock clock;
  std::ostringstream out;
  ProgressMeter m({.label = "fsdp_merge", .unit = ProgressUnit::kItems, .noun = "tensors"}, &out, clock.fn());
  clock.now = 10;  // checking the checkpoint took 10 s: not part of the rate
  m.set_total(4, 4 * kMiB);
  EXPECT_EQ(m.spec().total, 4);
  EXPECT_EQ(m.spec().total_bytes, 4 * kMiB);
  clock.now = 11;
  m.update(1, kMiB);
  clock.now = 12;
  m.add(1, kMiB);
  EXPECT_EQ(m.bytes(), 2 * kMiB);
  m.finish();
  // finish() redraws the last line (with the time of the finish) before its newline.
  const std::string second = redraw("fsdp_merge: 2 / 4 tensors, 2.0 MiB / 4.0 MiB (50%), 1.0 MiB/s, ETA 2s");
  EXPECT_EQ(out.str(),
            redraw("fsdp_merge: 1 / 4 tensors, 1.0 MiB / 4.0 MiB (25%), 1.0 MiB/s, ETA 3s") + second + second + "\n");
}

TEST(Progress, DisabledMeterWritesNothing) {
  FakeClock clock;
  {
    ProgressMeter m(bytes_spec(100), nullptr, clock.fn());
    EXPECT_FALSE(m.enabled());
    m.set_total(200);
    m.update(50);
    m.add(150);
    EXPECT_EQ(m.done(), 200);  // still counts
    m.finish();
    m.finish();
  }
  EXPECT_EQ(clock.reads, 0);  // and never reads the clock
}

TEST(Progress, OnTerminalFollowsStderr) {
  // Under ctest stderr is a pipe: disabled. Run by hand in a terminal: enabled (and then it
  // prints nothing here, as no update is made).
  auto m = ProgressMeter::on_terminal({.label = "x"});
  EXPECT_EQ(m.enabled(), isatty(STDERR_FILENO) == 1);
  EXPECT_EQ(m.spec().label, "x");
}
