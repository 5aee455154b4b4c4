#!/usr/bin/python3
"""tools/plot_run.py: one PNG of the training curves and step-time breakdown of one or more
fsdp_train runs, read from each run's metrics.jsonl.

    /usr/bin/python3 tools/plot_run.py RUN_DIR [RUN_DIR...] [-o PATH] [--smooth N]

RUN_DIR is a run directory (train.run_dir; its metrics.jsonl is read) or a metrics.jsonl
file itself. Needs only the standard library and matplotlib (Debian: python3-matplotlib;
rendered with the Agg backend, no display needed).

Panels (several runs overlay, one colour per run, same colour in every panel):
  (a) training loss (solid) and validation loss (dashed, with markers) against tokens
      trained; `--smooth N` draws the training loss as a trailing moving average over N
      steps (the raw curve stays, faint). Null or non-finite losses are skipped.
  (b) learning rate against tokens.
  (c) throughput (tokens_per_sec) against tokens.
  (d) MFU (%) against tokens ("mfu" is only logged when a peak FLOP/s is known).
  (e) where a step's time goes: per run one horizontal bar stacking the mean seconds per
      step of each phase (data, forward, backward, comm_wait, optimizer, eval, checkpoint;
      the *_s keys, which add up to step_s), with the mean step time at the bar's end: the
      mean over every step in metrics.jsonl (fsdp_train writes a line per step whatever
      train.log_every says).
  (f) comm_wait share of each step (comm_wait_s / step_s, %) against tokens: exposed
      communication, the part that did not overlap compute.
A panel without data for any run shows "no data" and why; runs missing from a panel are
named at its bottom. The title names the runs and their final validation loss.

The x axis is tokens trained (the "tokens" key, cumulative through the step; K/M/B scaled).
metrics.jsonl of older runs has no "tokens": if any run lacks it, every panel uses the step
number instead and the axis label says which run lacks tokens.

Legend names: each run directory's basename; runs whose basenames collide are named by as
many trailing path components as it takes to tell them apart (e.g. `a/run`, `b/run`).

metrics.jsonl as read here (docs/config.md train.run_dir): one JSON object per line with an
integer "step"; step lines carry loss, lr, grad_norm, tokens_per_sec, peak_mem_bytes and
optionally val_loss, tokens, step_s, the phase *_s keys and mfu; a start-of-run evaluation
is a line {"step": 0, "val_loss": ...}. A resumed run appends to the same file, so a step
can appear more than once: the last occurrence wins (the resumed run's values), and lines
are sorted by step.

Output: -o/--output PATH, default RUN_DIR/run.png for one run and ./runs.png for several;
the path written is printed on stdout. Exit status 0 on success; 2 with one line
`plot_run.py: FILE: message` on stderr when a metrics.jsonl is missing, empty, holds a
line that is not a JSON object with an integer "step" (FILE:LINE), or has no step lines
(step >= 1); 1 when the PNG cannot be written.

Examples:
    /usr/bin/python3 tools/plot_run.py runs/fortunes
    /usr/bin/python3 tools/plot_run.py runs/lr_1e-3 runs/lr_3e-3 -o lr_sweep.png --smooth 20
"""
import argparse
import json
import math
import os
import statistics
import sys
import textwrap

PROG = "plot_run.py"
PHASES = ["data", "forward", "backward", "comm_wait", "optimizer", "eval", "checkpoint"]
# Fixed phase colours (the same in every figure), chosen apart from the run colours' order.
PHASE_COLOURS = {
    "data": "#9e9e9e",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "comm_wait": "#c44e52",
    "optimizer": "#dd8452",
    "eval": "#8172b3",
    "checkpoint": "#937860",
}


class InputError(Exception):
    """A metrics.jsonl that cannot be plotted; str() is the one-line message."""


def finite(v):
    """v as a float if it is a finite number (not bool, not null), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def metrics_path(arg):
    """The metrics.jsonl of a RUN_DIR argument (or the argument itself if it is a file)."""
    if os.path.isfile(arg) and not os.path.isdir(arg):
        return arg
    return os.path.join(arg, "metrics.jsonl")


def load_records(path):
    """The records of one metrics.jsonl: the last line of each step, sorted by step.

    Raises InputError naming the file (and line) on a missing or empty file, a line that is
    not a JSON object with an integer "step", or no step lines (step >= 1). An unfinished last
    line (no newline yet: a run still writing) is skipped with a note on stderr.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}")
    if not text.strip():
        raise InputError(f"{path}: empty file")
    by_step = {}
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            if lineno == len(lines) and not text.endswith("\n"):
                # A run still writing: its last line is not complete yet. Plot the rest.
                print(f"plot_run.py: {path}:{lineno}: skipping an unfinished last line",
                      file=sys.stderr)
                continue
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise InputError(f"{path}:{lineno}: malformed JSON line: {msg}")
        if not isinstance(rec, dict):
            raise InputError(f"{path}:{lineno}: malformed line: not a JSON object")
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"{path}:{lineno}: malformed line: no integer \"step\" >= 0")
        by_step[step] = rec  # a resumed run's line replaces the earlier one
    if not any(s >= 1 for s in by_step):
        raise InputError(f"{path}: no step lines (no line with \"step\" >= 1)")
    return [by_step[s] for s in sorted(by_step)]


class Run:
    """One run's series, read from its metrics.jsonl."""

    def __init__(self, arg, name, records):
        self.arg = arg
        self.name = name
        self.records = records
        steps = [r for r in records if r["step"] >= 1]
        # Tokens trained through each step: the logged "tokens"; where a line lacks it (a
        # step-0 line, a nonfinite-stop line) but others have it, step x tokens per step
        # (constant: global_batch_size x seq_len).
        per_step = [r["tokens"] / r["step"] for r in steps if finite(r.get("tokens")) is not None]
        self.has_tokens = bool(per_step)
        self.tokens_per_step = statistics.median(per_step) if per_step else None

    def x(self, rec, use_tokens):
        if not use_tokens:
            return rec["step"]
        t = finite(rec.get("tokens"))
        return t if t is not None else rec["step"] * self.tokens_per_step

    def series(self, key, use_tokens, scale=1.0, steps_only=True):
        """(xs, ys) of the finite values of `key` (times `scale`)."""
        xs, ys = [], []
        for r in self.records:
            if steps_only and r["step"] < 1:
                continue
            v = finite(r.get(key))
            if v is not None:
                xs.append(self.x(r, use_tokens))
                ys.append(v * scale)
        return xs, ys

    def final_val(self):
        for r in reversed(self.records):
            v = finite(r.get("val_loss"))
            if v is not None:
                return r["step"], v
        return None

    def phase_means(self):
        """({phase: mean seconds per step}, mean step_s, steps) over the step lines that
        carry step_s, or None if there are none."""
        rows = [r for r in self.records if r["step"] >= 1 and finite(r.get("step_s")) is not None]
        if not rows:
            return None
        means = {p: sum(finite(r.get(p + "_s")) or 0.0 for r in rows) / len(rows) for p in PHASES}
        return means, sum(r["step_s"] for r in rows) / len(rows), len(rows)


def run_names(args):
    """Legend names: the basename of each run directory, lengthened by parent components
    where two runs' names would be equal (a metrics.jsonl argument names its directory)."""
    parts = []
    for a in args:
        p = os.path.abspath(a)
        if os.path.basename(p) == "metrics.jsonl" or os.path.isfile(p):
            p = os.path.dirname(p)
        comps = [c for c in p.split(os.sep) if c] or [os.sep]
        parts.append(comps)
    depth = [1] * len(args)
    while True:
        names = ["/".join(c[-d:]) for c, d in zip(parts, depth)]
        grew = False
        for j, n in enumerate(names):
            if names.count(n) > 1 and depth[j] < len(parts[j]):
                depth[j] += 1
                grew = True
        if not grew:  # the same directory given twice: number the repeats
            return [n if names[:i].count(n) == 0 else f"{n} ({names[:i].count(n) + 1})"
                    for i, n in enumerate(names)]


def token_unit(max_tokens):
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if max_tokens >= scale:
            return scale, f"tokens ({suffix})"
    return 1.0, "tokens"


def no_data(ax, why):
    ax.text(0.5, 0.5, "no data\n" + why, transform=ax.transAxes, ha="center", va="center",
            fontsize=10, color="0.45", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def note_missing(ax, missing):
    if missing:
        ax.text(0.01, 0.01, "no data: " + ", ".join(missing), transform=ax.transAxes,
                ha="left", va="bottom", fontsize=7.5, color="0.4")


def plot(runs, output, smooth):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import EngFormatter

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(runs) > len(colours):
        cmap = plt.get_cmap("tab20")
        colours = [cmap(i % 20) for i in range(len(runs))]
    colour = {id(r): colours[i % len(colours)] for i, r in enumerate(runs)}

    use_tokens = all(r.has_tokens for r in runs)
    if use_tokens:
        max_tok = max(r.x(rec, True) for r in runs for rec in r.records)
        xscale, xlabel = token_unit(max_tok)
    else:
        xscale, xlabel = 1.0, "step"
        lacking = [r.name for r in runs if not r.has_tokens]
        if len(runs) > 1 and len(lacking) < len(runs):
            xlabel += f'  (no "tokens" in metrics of {", ".join(lacking)})'
        else:
            xlabel += '  (metrics.jsonl has no "tokens")'

    def xs_of(xs):
        return [x / xscale for x in xs]

    fig, axes = plt.subplots(3, 2, figsize=(13, 11), dpi=110)
    ax_loss, ax_lr = axes[0]
    ax_tps, ax_mfu = axes[1]
    ax_phase, ax_comm = axes[2]

    # (a) loss
    any_loss = False
    for r in runs:
        c = colour[id(r)]
        xs, ys = r.series("loss", use_tokens)
        if xs:
            any_loss = True
            if smooth > 1:
                ax_loss.plot(xs_of(xs), ys, color=c, lw=0.8, alpha=0.25)
                sm, acc = [], 0.0
                for i, y in enumerate(ys):
                    acc += y
                    if i >= smooth:
                        acc -= ys[i - smooth]
                    sm.append(acc / min(i + 1, smooth))
                ax_loss.plot(xs_of(xs), sm, color=c, lw=1.6)
            else:
                ax_loss.plot(xs_of(xs), ys, color=c, lw=1.4)
        vx, vy = r.series("val_loss", use_tokens, steps_only=False)
        if vx:
            any_loss = True
            ax_loss.plot(xs_of(vx), vy, color=c, lw=1.5, ls="--", marker="o", ms=5.5,
                         markerfacecolor="white", markeredgewidth=1.5, zorder=3)
    if any_loss:
        handles = [Line2D([], [], color=colour[id(r)], lw=2, label=r.name) for r in runs]
        train_label = "train loss" + (f" (moving avg {smooth})" if smooth > 1 else "")
        handles += [Line2D([], [], color="0.2", lw=1.4, label=train_label),
                    Line2D([], [], color="0.2", lw=1.5, ls="--", marker="o", ms=5.5,
                           markerfacecolor="white", markeredgewidth=1.5, label="val loss")]
        ax_loss.legend(handles=handles, fontsize=8, loc="best", framealpha=0.85)
        ax_loss.set_ylabel("loss")
        ax_loss.set_xlabel(xlabel)
        note_missing(ax_loss, [r.name for r in runs
                               if not r.series("loss", use_tokens)[0]
                               and not r.series("val_loss", use_tokens, steps_only=False)[0]])
    else:
        no_data(ax_loss, "(no finite loss or val_loss)")
    ax_loss.set_title("(a) training and validation loss", loc="left", fontsize=11)

    # (b)-(d), (f): one line per run
    def line_panel(ax, title, key, ylabel, why, scale=1.0, ybottom=None, sci=False,
                   eng=False, ratio_of=None):
        drawn, missing = 0, []
        for r in runs:
            if ratio_of:
                xs, ys = [], []
                for rec in r.records:
                    num, den = finite(rec.get(ratio_of[0])), finite(rec.get(ratio_of[1]))
                    if rec["step"] >= 1 and num is not None and den:
                        xs.append(r.x(rec, use_tokens))
                        ys.append(100.0 * num / den)
            else:
                xs, ys = r.series(key, use_tokens, scale)
            if not xs:
                missing.append(r.name)
                continue
            drawn += 1
            ax.plot(xs_of(xs), ys, color=colour[id(r)], lw=1.3,
                    marker="o" if len(xs) <= 20 else None, ms=3, label=r.name)
        ax.set_title(title, loc="left", fontsize=11)
        if not drawn:
            no_data(ax, why)
            return
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ybottom is not None:
            ax.set_ylim(bottom=ybottom)
        if sci:
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
        if eng:
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))  # 25k, 1.5M
        if len(runs) > 1:
            ax.legend(fontsize=8, loc="best", framealpha=0.85)
        note_missing(ax, missing)

    line_panel(ax_lr, "(b) learning rate", "lr", "learning rate", '(no "lr")', sci=True)
    line_panel(ax_tps, "(c) throughput", "tokens_per_sec", "tokens/s", '(no "tokens_per_sec")',
               ybottom=0, eng=True)
    line_panel(ax_mfu, "(d) model FLOPs utilisation", "mfu", "MFU (%)",
               '(no "mfu" in metrics.jsonl:\nno peak FLOP/s known for the device)',
               scale=100.0, ybottom=0)
    line_panel(ax_comm, "(f) exposed communication: comm_wait share of each step", None,
               "comm_wait / step time (%)", '(no "comm_wait_s" and "step_s" in metrics.jsonl)',
               ybottom=0, ratio_of=("comm_wait_s", "step_s"))

    # (e) phase breakdown
    ax_phase.set_title("(e) mean time per step by phase", loc="left", fontsize=11)
    means = [r.phase_means() for r in runs]
    if not any(means):
        no_data(ax_phase, '(no "step_s" and phase "*_s" keys in metrics.jsonl)')
    else:
        longest = max(m[1] for m in means if m)
        unit, mult = ("ms", 1e3) if longest < 1.0 else ("s", 1.0)
        ys = list(range(len(runs)))[::-1]  # first run on top
        for y, r, m in zip(ys, runs, means):
            if not m:
                ax_phase.text(0, y, "  no phase data", va="center", fontsize=8.5, color="0.4")
                continue
            left = 0.0
            for p in PHASES:
                w = m[0][p] * mult
                ax_phase.barh(y, w, left=left, height=0.6, color=PHASE_COLOURS[p],
                              edgecolor="white", linewidth=0.5)
                left += w
            total = m[1] * mult
            ax_phase.text(max(left, total), y, f"  {total:.3g} {unit}/step (n={m[2]})",
                          va="center", fontsize=8.5)
        ax_phase.set_yticks(ys)
        ax_phase.set_yticklabels([r.name for r in runs], fontsize=8.5)
        ax_phase.set_ylim(-0.7, len(runs) - 0.3)
        ax_phase.set_xlim(0, longest * mult * 1.45)
        ax_phase.set_xlabel(f"{unit} per step (mean over the run's steps)")
        ax_phase.legend(handles=[Patch(color=PHASE_COLOURS[p], label=p)
                                 for p in PHASES],
                        fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                        frameon=False)

    for ax in (ax_loss, ax_lr, ax_tps, ax_mfu, ax_comm):
        if ax.has_data():
            ax.grid(True, alpha=0.35)
    if ax_phase.has_data():
        ax_phase.grid(True, axis="x", alpha=0.35)

    title = "fsdp_train: " + "  vs  ".join(r.name for r in runs)
    finals = []
    for r in runs:
        fv = r.final_val()
        finals.append(f"{r.name} {fv[1]:.4f} (step {fv[0]})" if fv else f"{r.name} -")
    lines = textwrap.wrap(title, 110)
    sub = textwrap.wrap("final val loss: " + ";  ".join(finals), 150)
    # Figure fractions of one title line (13 pt) and one subtitle line (9 pt) at 11 in.
    t_h, s_h = 13 * 1.3 / 72 / 11, 9 * 1.3 / 72 / 11
    fig.suptitle("\n".join(lines), fontsize=13, y=0.995, va="top")
    top = 0.995 - t_h * len(lines) - 0.004
    fig.text(0.5, top, "\n".join(sub), ha="center", va="top", fontsize=9, color="0.25")
    top -= s_h * len(sub)
    fig.tight_layout(rect=(0, 0, 1, top + 0.025), h_pad=1.6, w_pad=2.0)
    fig.savefig(output)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog=PROG, description="Plot loss, learning rate, throughput, MFU and the step-time "
        "phase breakdown of fsdp_train runs (RUN_DIR/metrics.jsonl) into one PNG.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR",
                    help="run directory (train.run_dir) or its metrics.jsonl")
    ap.add_argument("-o", "--output", metavar="PATH",
                    help="PNG to write (default: RUN_DIR/run.png for one run, ./runs.png for several)")
    ap.add_argument("--smooth", type=int, default=1, metavar="N",
                    help="moving average window (steps) for the training loss; 1 = off")
    a = ap.parse_args(argv)
    if a.smooth < 1:
        ap.error("--smooth must be >= 1")

    names = run_names(a.runs)
    runs = []
    try:
        for arg, name in zip(a.runs, names):
            runs.append(Run(arg, name, load_records(metrics_path(arg))))
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2

    if a.output:
        output = a.output
    elif len(a.runs) == 1:
        arg = a.runs[0]
        output = os.path.join(os.path.dirname(arg) if os.path.isfile(arg) else arg, "run.png")
    else:
        output = "runs.png"
    try:
        plot(runs, output, a.smooth)
    except OSError as e:
        print(f"{PROG}: {output}: cannot write: {e.strerror or e}", file=sys.stderr)
        return 1
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
