"""Matplotlib figures for the report, saved as PNG files next to its HTML.

Each `*_figure` function takes a finding's summary rows, writes one PNG into `folder`
and returns a `Figure` describing it, or returns None when the data cannot support the
plot (one case only, no ratios, no counters). Figures are built on `matplotlib.figure`
objects with the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from harness.report.data import COUNTERS, PhaseBreakdown, param_columns
from harness.report.summary import format_seconds
from harness.report.verdicts import case_phrase, format_param, present

#: how a scaling axis is labelled: param -> axis label with its unit
AXIS_LABELS = {"num_envs": "environments (num_envs)",
               "max_steps": "steps per environment, T (max_steps)"}
#: the colour of a run-vs-run change; any other change is NEUTRAL
CHANGE_COLOURS = {"improved": "#2a9d3f", "regressed": "#c0392b"}
NEUTRAL = "#7f8c8d"
DPI = 110


@dataclass(frozen=True)
class Figure:
    """A PNG written for the report: its file name (relative to the report) and words."""

    file: str
    title: str
    caption: str


@dataclass(frozen=True)
class Crossover:
    """Two variants' times cross between two measured points of a scaling curve."""

    param: str
    at: float
    """Where the lines cross (log-log interpolation), in the param's units."""
    slice: str
    """The other params held fixed, e.g. 'max_steps=25, dones=episode'."""
    faster_below: str
    """The variant that takes less time below the crossing."""
    faster_above: str

    def sentence(self) -> str:
        where = f" ({self.slice})" if self.slice else ""
        return (f"{self.faster_above} overtakes {self.faster_below} near "
                f"{self.param}={self.at:.3g}{where}: below it {self.faster_below} is faster, "
                f"above it {self.faster_above}.")


def crossings(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> list[tuple[float, float, bool]]:
    """Where curve `a` crosses curve `b`: [(x, y, a_faster_after)], log-log interpolated.

    `x [n]` increasing, `a [n]` and `b [n]` positive times at those x. A point where the
    two are exactly equal counts as a crossing only if the sign changes across it.
    """
    d = np.log(a) - np.log(b)  # [n]; < 0: a takes less time
    lx = np.log(x)
    out = []
    for i in range(len(x) - 1):
        if d[i] == 0 or np.sign(d[i]) == np.sign(d[i + 1]) or d[i + 1] == 0:
            continue
        w = d[i] / (d[i] - d[i + 1])  # fraction of the way from x[i] to x[i + 1]
        at = lx[i] + w * (lx[i + 1] - lx[i])
        y = np.log(a[i]) + w * (np.log(a[i + 1]) - np.log(a[i]))
        out.append((float(np.exp(at)), float(np.exp(y)), bool(d[i + 1] < 0)))
    return out


def _new_figure(width: float, height: float) -> MplFigure:
    fig = MplFigure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: MplFigure, folder: Path, name: str) -> str:
    fig.savefig(folder / name, dpi=DPI)
    return name


def _log_labels(axis, limits: tuple[float, float], label) -> None:
    """Label a log axis with `label(value)`, densely enough that a narrow range (where
    decades alone would leave one label or none) still reads."""
    formatter = FuncFormatter(lambda v, _: label(v))
    decades = math.log10(limits[1] / limits[0]) if limits[0] > 0 else math.inf
    if decades < 3:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(formatter if decades < 0.7 else NullFormatter())


def _case_ticks(ax, labels: list[str]) -> None:
    """Case names under grouped bars; slanted when more than three would collide."""
    slant = len(labels) > 3
    ax.set_xticks(range(len(labels)), labels, rotation=(30 if len(labels) > 8 else 20) * slant,
                  ha="right" if slant else "center", rotation_mode="anchor")


def _colours(variants: list[str]) -> dict[str, str]:
    # matplotlib's tab10, then tab20's light shades: distinct colours for up to 20 lines
    cycle = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
             "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
             "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#c7c7c7"]
    return {v: cycle[i % len(cycle)] for i, v in enumerate(variants)}


def _slices(rows: pd.DataFrame, param: str) -> list[tuple[str, pd.DataFrame]]:
    """Groups of timed rows with every other param fixed and >= 2 values of `param`."""
    timed = rows[rows["median_s"].notna()] if "median_s" in rows else rows.iloc[0:0]
    others = [c for c in param_columns(rows) if c != param]
    if timed.empty:
        return []
    groups = timed.groupby(others, sort=True, dropna=False) if others else [((), timed)]
    out = []
    for key, group in groups:
        if group[param].nunique() < 2:
            continue
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{c[2:]}={format_param(v)}" for c, v in zip(others, key)
                          if present(v))
        out.append((label, group))
    return out


def scaling_figure(finding: str, rows: pd.DataFrame, param: str, variants: list[str],
                   folder: Path) -> tuple[Figure, list[Crossover]] | None:
    """Log-log median time vs `param` (a `p_` column), one line per variant, one panel per
    setting of the other params; crossovers between variants are marked and returned."""
    if param not in rows or not pd.api.types.is_numeric_dtype(rows[param]):
        return None
    slices = _slices(rows, param)
    if not slices:
        return None
    name = param[2:]
    colours = _colours(variants)
    columns = min(3, len(slices))
    grid_rows = math.ceil(len(slices) / columns)
    fig = _new_figure(4.6 * columns + 0.6, 3.6 * grid_rows + 0.5)
    axes = np.atleast_1d(fig.subplots(grid_rows, columns, sharey=True, squeeze=False)).ravel()
    found: list[Crossover] = []
    for ax, (label, group) in zip(axes, slices):
        curves = {}
        for variant in variants:
            v = group[group["variant"] == variant].sort_values(param)
            if len(v) < 1:
                continue
            x, y = v[param].to_numpy(float), v["median_s"].to_numpy(float)
            curves[variant] = (x, y)
            ax.plot(x, y, marker="o", color=colours[variant], label=variant)
        found += _mark_crossovers(ax, curves, name, label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted(group[param].unique())
        ax.set_xticks(ticks, [format_param(t) for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        _log_labels(ax.yaxis, ax.get_ylim(), format_seconds)
        ax.set_title(label or "all cases", fontsize=10)
        ax.set_xlabel(AXIS_LABELS.get(name, name))
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[len(slices):]:
        ax.set_visible(False)
    axes[0].set_ylabel("median time per call")
    legend = {}  # label -> handle, once each across panels (crossovers repeat)
    for ax in axes[:len(slices)]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncols=len(legend),
               title="variant")
    fig.suptitle(f"{finding}: time per call vs {name} (log-log)")
    file = _save(fig, folder, f"{finding}-scaling-{name}.png")
    caption = (f"Median time per call against {name}, both axes logarithmic; one line per "
               f"variant, one panel per setting of the other parameters."
               + (" Crosses mark where two variants' lines cross." if found else ""))
    return Figure(file, f"Scaling with {name}", caption), found


def _mark_crossovers(ax, curves: dict, name: str, label: str) -> list[Crossover]:
    found = []
    variants = list(curves)
    for i, a in enumerate(variants):
        for b in variants[i + 1:]:
            xa, ya = curves[a]
            xb, yb = curves[b]
            common, ia, ib = np.intersect1d(xa, xb, return_indices=True)
            if len(common) < 2:
                continue
            for at, y, a_after in crossings(common, ya[ia], yb[ib]):
                ax.plot([at], [y], marker="X", markersize=10, color="black", linestyle="none",
                        label="crossover")
                found.append(Crossover(name, at, label, faster_below=b if a_after else a,
                                       faster_above=a if a_after else b))
    return found


def speedup_figure(finding: str, rows: pd.DataFrame, baseline: str, variants: list[str],
                   claim: float | None, folder: Path) -> Figure | None:
    """Speed-up over the baseline (1 / time ratio) per case and variant, with 95% CI whiskers."""
    compared = rows[rows["ratio"].notna()] if "ratio" in rows else rows.iloc[0:0]
    if compared.empty:
        return None
    cases = list(dict.fromkeys(compared["case"]))
    others = [v for v in variants if v in set(compared["variant"])]
    # where the baseline was not timed (skipped), the runner compared to another variant
    phrases = {r["case"]: case_phrase(r) + (
        f" [vs {r['compared_to']}]" if r.get("compared_to") not in (None, baseline)
        and isinstance(r.get("compared_to"), str) else "")
        for r in compared.to_dict("records")}
    colours = _colours(variants)
    width = 0.8 / len(others)
    fig = _new_figure(min(18.0, 3.0 + 0.45 * len(cases) * len(others) + 1.2 * len(cases)), 4.4)
    ax = fig.subplots()
    for j, variant in enumerate(others):
        v = compared[compared["variant"] == variant].set_index("case")
        xs, speed, low, high = [], [], [], []
        for i, case in enumerate(cases):
            if case in v.index:
                row = v.loc[case]
                xs.append(i - 0.4 + width * (j + 0.5))
                speed.append(1.0 / row["ratio"])
                low.append(1.0 / row["ratio"] - 1.0 / row["ci_high"])
                high.append(1.0 / row["ci_low"] - 1.0 / row["ratio"])
        # bars grow from 1x: up when faster, down when slower
        ax.bar(xs, np.array(speed) - 1.0, bottom=1.0, width=width * 0.9,
               color=colours[variant], label=variant)
        ax.errorbar(xs, speed, yerr=[low, high], fmt="none", ecolor="black", capsize=3,
                    elinewidth=1)
    ax.axhline(1.0, color="black", linewidth=1, label=f"same as {baseline}")
    if claim is not None:
        ax.axhline(claim, color="black", linestyle="--", linewidth=1,
                   label=f"ticket's estimate ~{claim:g}x")
    ax.set_yscale("log")
    _log_labels(ax.yaxis, ax.get_ylim(), lambda v: f"{v:g}x")
    _case_ticks(ax, [phrases[c] for c in cases])
    ax.set_xlabel("case")
    ax.set_ylabel(f"speed-up over {baseline} (x, log scale)")
    ax.set_title(f"{finding}: speed-up over {baseline}, with 95% bootstrap CI")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    file = _save(fig, folder, f"{finding}-speedup.png")
    return Figure(file, f"Speed-up over {baseline}",
                  "Bars: median baseline time / median variant time. Whiskers: 95% bootstrap "
                  "interval. Above the solid line the variant is faster. A case marked "
                  "[vs X] did not time the baseline: its bars are over X.")


def counters_figure(finding: str, rows: pd.DataFrame, variants: list[str],
                    folder: Path) -> Figure | None:
    """Per-call counters (allocations, host syncs, kernel launches) per case and variant."""
    shown = [c for c in COUNTERS if c in rows and rows[c].notna().any()]
    counted = rows.dropna(subset=shown, how="all") if shown else rows.iloc[0:0]
    if counted.empty or not (counted[shown].fillna(0) > 0).any().any():
        return None
    cases = list(dict.fromkeys(counted["case"]))
    phrases = {r["case"]: case_phrase(r) for r in counted.to_dict("records")}
    present_variants = [v for v in variants if v in set(counted["variant"])]
    colours = _colours(variants)
    width = 0.8 / len(present_variants)
    fig = _new_figure(min(18.0, 2.0 + (1.0 + 0.3 * len(present_variants)) * len(cases)),
                      2.9 * len(shown) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(shown), 1, sharex=True, squeeze=False)).ravel()
    for ax, counter in zip(axes, shown):
        for j, variant in enumerate(present_variants):
            v = counted[counted["variant"] == variant].set_index("case")
            xs = [i - 0.4 + width * (j + 0.5) for i, c in enumerate(cases) if c in v.index]
            ys = [v.loc[c, counter] for c in cases if c in v.index]
            ys = [y if present(y) else 0 for y in ys]
            ax.bar(xs, ys, width=width * 0.9, color=colours[variant], label=variant)
            for x, y in zip(xs, ys):
                if y == 0:  # an empty bar still says what was counted
                    ax.text(x, 0, "0", ha="center", va="bottom", fontsize=7)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylabel(f"{COUNTERS[counter]}\nper call")
        ax.grid(True, axis="y", alpha=0.3)
    _case_ticks(axes[-1], [phrases[c] for c in cases])
    axes[-1].set_xlabel("case")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", title="variant")
    fig.suptitle(f"{finding}: counts per call (profiling pass; symmetric log scale)")
    file = _save(fig, folder, f"{finding}-counters.png")
    return Figure(file, "Counters per call",
                  "Counts from the separate profiling pass, per call; they do not depend on "
                  "timing noise. The scale is logarithmic above 1 and linear below, so 0 shows.")


def phases_figure(finding: str, breakdown: PhaseBreakdown, folder: Path,
                  index: int) -> Figure:
    """Stacked horizontal bars of one iteration's phases, baseline vs variant."""
    fig = _new_figure(9.0, 3.2)
    ax = fig.subplots()
    names = [breakdown.baseline, breakdown.variant]
    colours = _colours(list(breakdown.phases))
    left = np.zeros(2)
    for phase, b, v in zip(breakdown.phases, breakdown.baseline_s, breakdown.variant_s):
        widths = np.array([b, v])
        ax.barh(names, widths, left=left, color=colours[phase], label=phase)
        left += widths
    ax.plot([breakdown.baseline_median_s, breakdown.variant_median_s], names, marker="D",
            color="black", linestyle="none", label="measured median\n(not profiled)")
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_seconds(v) if v else "0"))
    ax.set_xlabel("time per iteration")
    ax.set_title(f"{finding} ({breakdown.case}): one iteration by phase, profiled")
    handles, labels = ax.get_legend_handles_labels()  # lines come first: the marker goes last
    fig.legend(handles[1:] + handles[:1], labels[1:] + labels[:1], loc="outside right upper",
               fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    file = _save(fig, folder, f"{finding}-phases-{index}.png")
    return Figure(file, f"Phases: {breakdown.baseline} vs {breakdown.variant}",
                  "Stacked bars: seconds of each phase in one profiled iteration (profiling "
                  "adds overhead). Diamonds: the unprofiled median time per iteration.")


def compare_figure(rows: pd.DataFrame, factor: float, folder: Path) -> Figure | None:
    """Ratio new / old per finding x case x variant with its 95% CI, coloured by change."""
    compared = rows[rows["ratio"].notna()]
    if compared.empty:
        return None
    labels = [f"{r['finding']} {r['variant']} @ {r['where']}" for r in compared.to_dict("records")]
    fig = _new_figure(10.0, 1.2 + 0.28 * len(compared))
    ax = fig.subplots()
    y = np.arange(len(compared))
    ratio = compared["ratio"].to_numpy(float)
    err = [ratio - compared["ci_low"].to_numpy(float), compared["ci_high"].to_numpy(float) - ratio]
    colours = [CHANGE_COLOURS.get(c, NEUTRAL) for c in compared["change"]]
    ax.errorbar(ratio, y, xerr=err, fmt="none", ecolor="#555555", capsize=2)
    ax.scatter(ratio, y, c=colours, zorder=3)
    for change, colour in [*CHANGE_COLOURS.items(), ("no change beyond the factor", NEUTRAL)]:
        ax.scatter([], [], c=colour, label=change)  # legend entries only
    ax.axvline(1.0, color="black", linewidth=1)
    for bound in (factor, 1.0 / factor):
        ax.axvline(bound, color="black", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    _log_labels(ax.xaxis, ax.get_xlim(), lambda v: f"{v:g}")
    ax.legend(loc="best", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time ratio new / old (log scale; below 1: the new run is faster)")
    ax.set_title(f"Run vs run: ratio of medians with 95% bootstrap CI "
                 f"(dotted: the {factor:g}x factor)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    file = _save(fig, folder, "compare.png")
    return Figure(file, "New vs old",
                  "Green: improved; red: regressed; grey: no measurable change or within the "
                  "factor.")
