// The one-line progress meter of fsdp_prepare and fsdp_merge (see fsdp/core/progress.hpp):
// a pure formatter, and a meter that throttles and rewrites the line in place.
#include "fsdp/core/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <utility>

#include "fsdp/core/host_memory.hpp"

namespace fsdp {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// "4.9 KiB / 12.3 MiB" (fsdp::human_bytes).
std::string bytes_done(int64_t done, int64_t total) {
  return human_bytes(static_cast<double>(done)) + " / " + human_bytes(static_cast<double>(total));
}

std::string fixed1(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// What percent, rate and ETA follow: bytes (kBytes: done), except for items counted alone.
struct Measure {
  int64_t num, den;
  bool complete() const { return den <= 0 || num >= den; }
};
Measure measure(const ProgressSpec& spec, int64_t done, int64_t bytes) {
  if (spec.unit == ProgressUnit::kBytes) return {done, spec.total};
  if (spec.total_bytes > 0) return {bytes, spec.total_bytes};
  return {done, spec.total};
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

std::string format_progress_line(const ProgressSpec& spec, int64_t done, int64_t bytes, double elapsed_s) {
  const bool items = spec.unit == ProgressUnit::kItems;
  const bool item_bytes = items && spec.total_bytes > 0;
  if (!items) bytes = done;
  const Measure m = measure(spec, done, bytes);
  const int64_t num = m.num, den = m.den;
  const bool complete = m.complete();
  const double fraction =
      complete ? 1.0 : std::clamp(static_cast<double>(num) / static_cast<double>(den), 0.0, 1.0);
  const bool rate_known = num > 0 && elapsed_s > 0;

  std::string line = spec.label + ": ";
  if (items) {
    line += std::to_string(done) + " / " + std::to_string(spec.total) + " " + spec.noun;
    if (item_bytes) line += ", " + bytes_done(bytes, spec.total_bytes);
  } else {
    line += bytes_done(done, spec.total);
  }
  // Whole percent, rounded down in integers (100% only when all is done).
  const int64_t percent = complete ? 100
                          : num <= 0 ? 0
                                     : static_cast<int64_t>(static_cast<__int128>(num) * 100 / den);
  line += " (" + std::to_string(percent) + "%), ";
  if (items && !item_bytes) {
    line += (rate_known ? fixed1(static_cast<double>(done) / elapsed_s) : std::string("--")) + " " + spec.noun + "/s";
  } else {
    line += (rate_known ? fixed1(static_cast<double>(bytes) / kMiB / elapsed_s) : std::string("--")) + " MiB/s";
  }
  line += ", ETA ";
  if (complete) {
    line += "0s";
  } else if (rate_known) {
    line += format_duration(elapsed_s * (1.0 - fraction) / fraction);
  } else {
    line += "--";
  }
  return line;
}

// ---------------------------------------------------------------- ProgressMeter

double ProgressMeter::steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ProgressMeter::ProgressMeter(ProgressSpec spec, std::ostream* out, Clock clock, double min_interval_s)
    : spec_(std::move(spec)),
      out_(out),
      clock_(clock ? std::move(clock) : Clock(steady_seconds)),
      min_interval_s_(min_interval_s) {
  if (out_) start_ = clock_();
}

ProgressMeter ProgressMeter::on_terminal(ProgressSpec spec) {
  return ProgressMeter(std::move(spec), isatty(STDERR_FILENO) ? &std::cerr : nullptr);
}

ProgressMeter::~ProgressMeter() {
  try {
    finish();
  } catch (...) {  // a stream that throws (exceptions enabled on it): the line stays unfinished
  }
}

void ProgressMeter::set_total(int64_t total, int64_t total_bytes) {
  spec_.total = total;
  spec_.total_bytes = total_bytes;
  complete_ = false;
  if (out_) start_ = clock_();
}

void ProgressMeter::update(int64_t done, int64_t bytes) {
  done_ = done;
  bytes_ = spec_.unit == ProgressUnit::kBytes ? done : bytes;
  if (!out_ || finished_) return;
  const double now = clock_();
  // The first time the total is reached: drawn whatever the throttle says, and the time
  // frozen, so the line shows 100% and the rate of the work while the tool finishes up.
  const Measure m = measure(spec_, done_, bytes_);
  if (!complete_ && m.den > 0 && m.complete()) {
    complete_ = true;
    complete_at_ = now;
  } else if (drawn_ && now - last_draw_ < min_interval_s_) {
    return;
  }
  draw(now, false);
}

void ProgressMeter::add(int64_t delta, int64_t delta_bytes) { update(done_ + delta, bytes_ + delta_bytes); }

void ProgressMeter::finish() {
  if (!out_ || finished_) return;
  finished_ = true;
  if (drawn_) draw(clock_(), true);
}

void ProgressMeter::draw(double now, bool final_line) {
  const double elapsed = std::max(0.0, (complete_ ? complete_at_ : now) - start_);
  *out_ << '\r' << format_progress_line(spec_, done_, bytes_, elapsed) << "\033[K";
  if (final_line) *out_ << '\n';
  out_->flush();
  drawn_ = true;
  last_draw_ = now;
}

}  // namespace fsdp
