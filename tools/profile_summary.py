#!/usr/bin/env python3
"""tools/profile_summary.py: where the time of profiled steps went, from fsdp_train's Chrome
traces (train.profile_steps / --profile: RUN_DIR/profile/rank_N.trace.json).

    python3 tools/profile_summary.py TRACE [TRACE...] [--top N] [--markdown]
                                     [--only kernels|idle|host] [--name-width W]

Standard library only. For each trace: the profiled steps (the "step N" ranges; torch
traces' "ProfilerStep#N" annotations count too) and their total time, then two tables of
the top N names (default 20) by total time:
  - kernels: complete events of category "kernel" (CUDA kernels, one per launch);
  - GPU idle gaps (traces with kernels): inside each step range, every interval in which no
    kernel, copy or memset runs on any stream, charged to the activity that ends it (the
    kernel the GPU waited for; "(step end)" for the idle tail of a step), with the summary
    line's idle total and its split by gap length (< 5 us: launch gaps between queued
    kernels; 5-50 us; 50-500 us: host round trips; >= 500 us: the GPU waited for host work);
  - host ranges: every other complete event on the host (step phases such as "forward" and
    "comm_wait", collective issue/wait ranges such as "all_gather wait unit 3 (h.2)"),
    the "step N" ranges themselves excepted (they are the denominator);
with columns count, total ms, mean us, % of profiled time (the sum of the step ranges; for
kernels that is GPU time over wall time) and ms/step (total / number of profiled steps).
Events of the same name are summed.

With several traces (two runs, or two ranks) the columns stand side by side, one group per
trace (A, B, ...), and "B/A" gives each later trace's ms/step over the first's ("-" where a
name is missing from one). Rows are ranked by their largest ms/step over the traces.

--markdown prints GitHub markdown tables (tools/gpu_check.sh pastes the kernel table into
its summary); --only picks one table; --name-width cuts long names (C++ kernel names) to W
characters, keeping both ends (0: never; default 70).

Exit status 0; 2 with one line `profile_summary.py: FILE: message` on stderr when a trace
is missing, is not JSON, or holds no "traceEvents" list.

Examples:
    python3 tools/profile_summary.py runs/gpt2/profile/rank_0.trace.json
    python3 tools/profile_summary.py before/profile/rank_0.trace.json \\
        after/profile/rank_0.trace.json --top 10 --markdown
"""
import argparse
import gzip
import json
import re
import sys

PROG = "profile_summary.py"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
STEP_RE = re.compile(r"^(step \d+|ProfilerStep#\d+)$")
# Upper bounds (us) of the idle-gap length classes: launch gaps, short host work, host round
# trips, long host work.
IDLE_BUCKETS_US = [5.0, 50.0, 500.0, float("inf")]


class InputError(Exception):
    pass


class Trace:
    """One trace: per-name totals of kernels and host ranges, and its profiled steps."""

    def __init__(self, path, label):
        self.path = path
        self.label = label
        events = load_events(path)
        self.kernels = {}  # name -> [count, total_us]
        self.host = {}
        self.steps = []  # (name, dur_us)
        step_windows = []  # (ts_us, end_us) of each step range
        gpu = []  # (ts_us, end_us, name) of each kernel, copy and memset
        for e in events:
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            name = str(e.get("name", "?"))
            cat = str(e.get("cat", ""))
            try:
                dur = float(e.get("dur", 0))
            except (TypeError, ValueError):
                raise InputError(f"{path}: event {name!r} has a non-numeric dur")
            try:
                ts = float(e.get("ts", 0))
            except (TypeError, ValueError):
                raise InputError(f"{path}: event {name!r} has a non-numeric ts")
            if cat == "step" or (STEP_RE.match(name) and cat in ("step", "user_annotation")):
                self.steps.append((name, dur))
                step_windows.append((ts, ts + dur))
                continue
            if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
                gpu.append((ts, ts + dur, name))
            if cat == "kernel":
                table = self.kernels
            elif cat in GPU_CATS:
                continue
            else:
                table = self.host
            row = table.setdefault(name, [0, 0.0])
            row[0] += 1
            row[1] += dur
        self.num_steps = max(1, len(self.steps))
        self.profiled_us = sum(d for _, d in self.steps)
        if not self.steps:  # no step ranges: the span of all events stands for one step
            xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
            if xs:
                start = min(float(e.get("ts", 0)) for e in xs)
                end = max(float(e.get("ts", 0)) + float(e.get("dur", 0)) for e in xs)
                self.profiled_us = end - start

        # GPU idle: within each step window, the time no kernel, copy or memset runs on any
        # stream, charged to the activity that ends the gap ("(step end)" for the tail).
        self.idle = {}  # name -> [gaps, idle_us]
        self.idle_buckets = [[0, 0.0] for _ in IDLE_BUCKETS_US]  # [gaps, idle_us] by length
        if gpu:
            gpu.sort()
            for w0, w1 in step_windows:
                at = w0  # the GPU is busy up to here
                for g0, g1, name in gpu:
                    if g1 <= w0 or g0 >= w1:
                        continue
                    if g0 > at:
                        self._add_idle(name, g0 - at)
                    at = max(at, min(g1, w1))
                if w1 > at:
                    self._add_idle("(step end)", w1 - at)

    def _add_idle(self, name, us):
        row = self.idle.setdefault(name, [0, 0.0])
        row[0] += 1
        row[1] += us
        for i, limit in enumerate(IDLE_BUCKETS_US):
            if us < limit:
                self.idle_buckets[i][0] += 1
                self.idle_buckets[i][1] += us
                break

    def per_step_ms(self, table, name):
        row = table.get(name)
        return None if row is None else row[1] / 1e3 / self.num_steps


def load_events(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON (line {e.lineno}: {e.msg})")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError(f"{path}: no \"traceEvents\" list (not a Chrome trace)")
    return events


def short(name):
    """A kernel's demangled signature without what every kernel shares: the return type
    ("void "), namespaces (fsdp::cuda::kernels::, (anonymous namespace)::) and the parameter
    list; the template arguments stay ("flash_fwd<__nv_bfloat16, 64>")."""
    s = name[5:] if name.startswith("void ") else name
    s = s.replace("(anonymous namespace)::", "")
    depth, cut_at = 0, len(s)  # the parameter list: the last top-level "(...)"
    for i in range(len(s) - 1, -1, -1):
        c = s[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                cut_at = i
                break
    if cut_at > 0 and s.endswith(")"):
        s = s[:cut_at]
    head, _, _ = s.partition("<")
    if "::" in head:  # drop the namespaces of the kernel's own name
        s = head.rsplit("::", 1)[1] + s[len(head):]
    return s


def cut(name, width):
    name = short(name)
    if width <= 0 or len(name) <= width:
        return name
    keep = width - 3
    return name[: keep - keep // 3] + "..." + name[len(name) - keep // 3:]


def fmt(x, digits):
    return "-" if x is None else f"{x:,.{digits}f}"


def rows_of(traces, which, top):
    """The top names of table `which` ("kernels" or "host") over all traces."""
    names = set()
    for t in traces:
        names.update(getattr(t, which))
    def key(name):
        best = max((t.per_step_ms(getattr(t, which), name) or 0.0) for t in traces)
        return (-best, name)
    return sorted(names, key=key)[:top]


def table(traces, which, top, width):
    """(header, rows) of one table; numbers already formatted."""
    header = ["name"]
    several = len(traces) > 1
    for t in traces:
        p = f"{t.label} " if several else ""
        header += [p + "count", p + "total ms", p + "mean us", p + "%", p + "ms/step"]
    for t in traces[1:]:
        header.append(f"{t.label}/{traces[0].label}")
    rows = []
    for name in rows_of(traces, which, top):
        row = [cut(name, width)]
        for t in traces:
            r = getattr(t, which).get(name)
            if r is None:
                row += ["-"] * 5
                continue
            count, total = r
            pct = 100.0 * total / t.profiled_us if t.profiled_us > 0 else None
            row += [str(count), fmt(total / 1e3, 3), fmt(total / count, 1), fmt(pct, 1),
                    fmt(total / 1e3 / t.num_steps, 3)]
        a = traces[0].per_step_ms(getattr(traces[0], which), name)
        for t in traces[1:]:
            b = t.per_step_ms(getattr(t, which), name)
            row.append(fmt(b / a, 2) if a and b is not None else "-")
        rows.append(row)
    return header, rows


def print_table(title, header, rows, markdown, out):
    if markdown:
        esc = lambda s: s.replace("|", "\\|")
        print(f"### {title}\n", file=out)
        print("| " + " | ".join(esc(h) for h in header) + " |", file=out)
        print("|---" + "|---:" * (len(header) - 1) + "|", file=out)
        for r in rows:
            print("| " + " | ".join(esc(c) for c in r) + " |", file=out)
        if not rows:
            print("| (none) |" + " |" * (len(header) - 1), file=out)
        print(file=out)
        return
    print(title, file=out)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                                   for i, c in enumerate(cells))
    print(line(header), file=out)
    for r in rows:
        print(line(r), file=out)
    if not rows:
        print("  (none)", file=out)
    print(file=out)


def summary(traces, markdown, out):
    for t in traces:
        steps = ", ".join(n for n, _ in t.steps) if t.steps else "no step ranges (whole trace)"
        kernel_us = sum(r[1] for r in t.kernels.values())
        text = (f"{t.label}: {t.path}: {len(t.steps)} profiled step(s) ({steps}), "
                f"{t.profiled_us / 1e3:,.3f} ms, {t.profiled_us / 1e3 / t.num_steps:,.3f} ms/step")
        if t.kernels:
            text += (f"; kernels {kernel_us / 1e3:,.3f} ms "
                     f"({100.0 * kernel_us / t.profiled_us if t.profiled_us else 0:.1f}% of it)")
        if t.idle:
            idle_us = sum(r[1] for r in t.idle.values())
            text += (f"; GPU idle {idle_us / 1e3 / t.num_steps:,.3f} ms/step "
                     f"({100.0 * idle_us / t.profiled_us if t.profiled_us else 0:.1f}%)")
            names = ["< 5 us", "5-50 us", "50-500 us", ">= 500 us"]
            parts = [f"{n}: {c} gaps {u / 1e3 / t.num_steps:,.3f} ms/step"
                     for n, (c, u) in zip(names, t.idle_buckets)]
            text += " [" + "; ".join(parts) + "]"
        print(("- " if markdown else "") + text, file=out)
    print(file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", metavar="TRACE", help="a Chrome trace (.json or .json.gz)")
    ap.add_argument("--top", type=int, default=20, metavar="N", help="rows per table (default 20)")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--only", choices=["kernels", "idle", "host"], help="print one table only")
    ap.add_argument("--name-width", type=int, default=70, metavar="W",
                    help="cut names to W characters (0: never; default 70)")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error("--top: expected N >= 1")
    try:
        traces = [Trace(p, chr(ord("A") + i) if i < 26 else f"T{i}")
                  for i, p in enumerate(args.traces)]
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    out = sys.stdout
    summary(traces, args.markdown, out)
    if args.only in (None, "kernels"):
        if any(t.kernels for t in traces) or args.only == "kernels":
            h, r = table(traces, "kernels", args.top, args.name_width)
            print_table(f"Top kernels by time (top {args.top})", h, r, args.markdown, out)
        else:
            print("no kernels in the trace(s) (a CPU run: host ranges only)\n", file=out)
    if args.only == "idle" or (args.only is None and any(t.idle for t in traces)):
        h, r = table(traces, "idle", args.top, args.name_width)
        print_table(f"GPU idle gaps by the activity that ends them (top {args.top})", h, r,
                    args.markdown, out)
    if args.only in (None, "host"):
        h, r = table(traces, "host", args.top, args.name_width)
        print_table(f"Top host ranges by time (top {args.top})", h, r, args.markdown, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
