"""Matplotlib figures for the report, saved as PNG files next to its HTML.

Each `*_figure` function takes a finding's summary rows, writes one PNG into `folder`
and returns a `Figure` describing it, or returns None when the data cannot support the
plot (one case only, no ratios, no counters). Figures are built on `matplotlib.figure`
objects with the Agg canvas: no pyplot state, no display needed.

Every chart must read at a glance at the default run's size: `layout_problems` checks a
drawn figure for overlapping labels, more than MAX_SERIES series in a panel, a legend
over data and a width beyond the page's column, and each `Figure` carries what it found
(the tests require none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter
from PIL import Image

from harness.report.data import COUNTERS, PhaseBreakdown, param_columns
from harness.report.summary import format_seconds
from harness.report.verdicts import case_phrase, format_param, level_label, present

#: how a scaling axis is labelled: param -> axis label with its unit
AXIS_LABELS = {"num_envs": "environments (num_envs)",
               "max_steps": "steps per environment, T (max_steps)"}
#: the colour of a run-vs-run change; any other change is NEUTRAL
CHANGE_COLOURS = {"faster": "#2a9d3f", "slower": "#c0392b"}
NEUTRAL = "#7f8c8d"
DPI = 110
#: the most series (variants, lines) one panel may hold and still be told apart
MAX_SERIES = 12
#: the widest figure the page shows at full size, in pixels (its content column)
MAX_WIDTH_PX = 1150
#: a chart with more bars than this per panel (cases x variants) is drawn another way
MAX_BARS = 40


@dataclass(frozen=True)
class Figure:
    """A PNG written for the report: its file name (relative to the report) and words."""

    file: str
    title: str
    caption: str
    problems: tuple[str, ...] = ()
    """What `layout_problems` found when it was drawn; empty for a readable chart."""


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


def _save(fig: MplFigure, folder: Path, name: str, title: str, caption: str) -> Figure:
    """Write `fig` as `folder/name` (PNG) and describe it, with its layout problems.

    The figure is drawn once: the layout check reads that drawing and the PNG is its
    pixels (savefig would run the constrained layout and draw everything again, half of
    a large chart's seconds)."""
    problems = tuple(layout_problems(fig))
    Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).save(folder / name, format="png")
    return Figure(name, title, caption, problems)


def _overlapping(boxes: list) -> bool:
    """Whether any two display boxes overlap by more than a pixel each way."""
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if (min(a.x1, b.x1) - max(a.x0, b.x0) > 1) and (min(a.y1, b.y1) - max(a.y0, b.y0) > 1):
                return True
    return False


def _data_points(ax) -> np.ndarray:
    """Display coordinates [n, 2] of what `ax` plots: line vertices, scatter points and
    the corners and centre of every bar."""
    points = [np.empty((0, 2))]
    for line in ax.get_lines():
        xy = line.get_xydata()
        if len(xy):
            points.append(line.get_transform().transform(xy))
    for collection in ax.collections:
        offsets = collection.get_offsets()
        if len(offsets):
            points.append(collection.get_offset_transform().transform(offsets))
    for patch in ax.patches:
        box = patch.get_window_extent()
        points.append(np.array([[box.x0, box.y0], [box.x1, box.y1], [box.x0, box.y1],
                                [box.x1, box.y0], [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]]))
    return np.concatenate(points)


def layout_problems(fig: MplFigure) -> list[str]:
    """What makes a drawn figure hard to read, one line each; [] when it reads well.

    Checks: the width against MAX_WIDTH_PX (wider is shown shrunk); tick labels of an
    axis that overlap; texts inside a panel that overlap (cell labels); more than
    MAX_SERIES labelled series in a panel; a legend over plotted data.
    """
    fig.canvas.draw()  # final positions (constrained layout runs at draw time)
    renderer = fig.canvas.get_renderer()
    problems = []
    width = fig.get_figwidth() * fig.dpi
    if width > MAX_WIDTH_PX:
        problems.append(f"{width:.0f} px wide: shown shrunk in a {MAX_WIDTH_PX} px column")
    for n, ax in enumerate(a for a in fig.axes if a.get_visible()):
        name = ax.get_title() or ax.get_ylabel() or f"panel {n}"
        for axis in ("x", "y"):
            labels = getattr(ax, f"get_{axis}ticklabels")(which="both")
            boxes = [t.get_window_extent(renderer) for t in labels
                     if t.get_visible() and t.get_text()]
            if _overlapping(boxes):
                problems.append(f"{name}: {axis} tick labels overlap")
        texts = [t.get_window_extent(renderer) for t in ax.texts if t.get_visible() and t.get_text()]
        if _overlapping(texts):
            problems.append(f"{name}: labels inside the panel overlap")
        series = {label for label in ax.get_legend_handles_labels()[1]}
        if len(series) > MAX_SERIES:
            problems.append(f"{name}: {len(series)} series in one panel (at most {MAX_SERIES})")
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            points = _data_points(ax)
            inside = ((points[:, 0] > box.x0) & (points[:, 0] < box.x1)
                      & (points[:, 1] > box.y0) & (points[:, 1] < box.y1))
            if inside.any():
                problems.append(f"the legend covers data of {ax.get_title() or 'a panel'}")
                break
    return problems


def _log_labels(axis, limits: tuple[float, float], label) -> None:
    """Label a log axis with `label(value)`, densely enough that a narrow range (where
    decades alone would leave one label or none) still reads."""
    formatter = FuncFormatter(lambda v, _: label(v))
    decades = math.log10(limits[1] / limits[0]) if limits[0] > 0 else math.inf
    if decades < 0.7:  # less than a factor of 5: round values, 1 among them where in range
        low, high = math.floor(math.log10(limits[0])), math.ceil(math.log10(limits[1]))
        ticks = [m * 10.0 ** e for e in range(low, high + 1)
                 for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)]
        axis.set_major_locator(FixedLocator([t for t in ticks if limits[0] <= t <= limits[1]]))
    elif decades < 3:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


def _case_ticks(ax, labels: list[str]) -> None:
    """Case names under grouped bars, the setting in brackets on a second line; slanted
    only when more than six would not fit side by side."""
    labels = [label.replace(" (", "\n(").replace(" [", "\n[") for label in labels]
    slant = len(labels) > 6
    ax.set_xticks(range(len(labels)), labels, rotation=30 * slant, fontsize=9,
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
    panel_width = 3.3
    fig = _new_figure(panel_width * columns + 0.5, 3.0 * grid_rows + 1.0)
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
        ax.set_xticks(ticks, _spaced_labels(ticks, panel_width - 0.7))
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
    fig.legend(legend.values(), legend.keys(), loc="outside lower center",
               ncols=min(len(legend), 6), title="variant", fontsize=8)
    fig.suptitle(f"{finding}: time per call vs {name} (log-log)")
    caption = (f"Median time per call against {name}, both axes logarithmic; one line per "
               f"variant, one panel per setting of the other parameters."
               + (" Crosses mark where two variants' lines cross." if found else ""))
    return _save(fig, folder, f"{finding}-scaling-{name}.png", f"Scaling with {name}",
                 caption), found


def _spaced_labels(ticks: list[float], axis_inches: float, label_inches: float = 0.3) -> list[str]:
    """Labels for log-axis ticks, blank where a label would touch the one before it
    (`label_inches`: the width of a label of about four digits at 8-10 pt)."""
    decades = math.log10(ticks[-1] / ticks[0]) if ticks[0] > 0 and len(ticks) > 1 else 0.0
    min_ratio = 10 ** (label_inches * decades / axis_inches) if decades else 1.0
    labels, last = [], None
    for t in ticks:
        keep = last is None or t / last >= min_ratio
        labels.append(format_param(t) if keep else "")
        last = t if keep else last
    return labels


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
    """Speed-up over the baseline (1 / time ratio) per case and variant, with whiskers at
    the level of each row's interval (`level_label`)."""
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
    inches = 3.0 + 0.45 * len(cases) * len(others) + 1.2 * len(cases)
    fig = _new_figure(min(MAX_WIDTH_PX / DPI, inches), 4.4)
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
    level = level_label(compared["ci_level"] if "ci_level" in compared else [])
    ax.set_title(f"{finding}: speed-up over {baseline}, with {level} intervals")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _save(fig, folder, f"{finding}-speedup.png", f"Speed-up over {baseline}",
                  "Bars: median baseline time / median variant time. Whiskers: the ratio's "
                  f"{level} interval. Above the solid line the variant is faster. A case marked "
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
    inches = 2.0 + (1.0 + 0.3 * len(present_variants)) * len(cases)
    fig = _new_figure(min(MAX_WIDTH_PX / DPI, inches),
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
    return _save(fig, folder, f"{finding}-counters.png", "Counters per call",
                  "Counts from the separate profiling pass, per call; they do not depend on "
                  "timing noise. The scale is logarithmic above 1 and linear below, so 0 shows.")


def phases_figure(finding: str, breakdown: PhaseBreakdown, folder: Path,
                  index: int) -> Figure:
    """Stacked horizontal bars of one call's phases (`Recording.phases`), baseline vs variant."""
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
            color="black", linestyle="none", label="median time\nper call")
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_seconds(v) if v else "0"))
    ax.set_xlabel("time per call")
    ax.set_title(f"{finding} ({breakdown.case}): one call by phase")
    handles, labels = ax.get_legend_handles_labels()  # lines come first: the marker goes last
    fig.legend(handles[1:] + handles[:1], labels[1:] + labels[:1], loc="outside right upper",
               fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, folder, f"{finding}-phases-{index}.png",
                 f"Phases: {breakdown.baseline} vs {breakdown.variant}",
                  "Stacked bars: each phase's median seconds over the timed calls. Diamonds: "
                  "the median time per call.")


def compare_figure(rows: pd.DataFrame, margin: float, folder: Path) -> Figure | None:
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
    for change, colour in [*CHANGE_COLOURS.items(), ("no change beyond the margin", NEUTRAL)]:
        ax.scatter([], [], c=colour, label=change)  # legend entries only
    ax.axvline(1.0, color="black", linewidth=1)
    for bound in (1.0 + margin, 1.0 / (1.0 + margin)):
        ax.axvline(bound, color="black", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    _log_labels(ax.xaxis, ax.get_xlim(), lambda v: f"{v:g}")
    ax.legend(loc="best", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the reference, new / old (log scale; below 1: faster in the new run)")
    ax.set_title(f"Run vs run: ratio of medians with 95% bootstrap CI "
                 f"(dotted: the {margin:.0%} margin)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    return _save(fig, folder, "compare.png", "New vs old",
                  "Green: faster; red: slower; grey: no measurable change or within the "
                  "margin.")


#: what a heat-map cell says when it has no speed-up: verdict or status -> word
CELL_WORDS = {"baseline": "ref", "needs_cuda": "CUDA", "not_timed": "skip", "failed": "ERROR",
              "mismatch": "FAIL"}


def _speed_label(speedup: float) -> str:
    """11.83 -> '11.8x', 0.5 -> '0.5x', 1234.5 -> '1234x'."""
    return f"{speedup:.0f}x" if speedup >= 100 else f"{speedup:.3g}x"


def speedup_heatmap(finding: str, rows: pd.DataFrame, baseline: str, variants: list[str],
                    folder: Path) -> Figure | None:
    """Speed-up over the baseline per case (a row) x variant (a column): a colour on a log
    scale (green faster, red slower, grey no measurable difference) and the number.

    A case where the baseline was not timed is compared with the runner's stand-in
    (`compared_to`), named in the row label; untimed cells say why in a word.
    """
    columns = [v for v in variants if v != baseline and v in set(rows["variant"])]
    cases = list(dict.fromkeys(rows["case"]))
    if not columns or "ratio" not in rows or rows["ratio"].isna().all():
        return None
    by = {(r["case"], r["variant"]): r for r in rows.to_dict("records")}
    log_speed = np.full((len(cases), len(columns)), np.nan)  # [cases, variants]
    no_difference = np.zeros_like(log_speed, dtype=bool)
    words = [["" for _ in columns] for _ in cases]
    labels = []
    for i, case in enumerate(cases):
        stand_in = None
        for j, variant in enumerate(columns):
            row = by.get((case, variant))
            if row is None:
                continue
            if present(row.get("ratio")):
                log_speed[i, j] = -math.log10(row["ratio"])
                no_difference[i, j] = row.get("verdict") == "no_difference"
                words[i][j] = _speed_label(1.0 / row["ratio"])
                if isinstance(row.get("compared_to"), str) and row["compared_to"] != baseline:
                    stand_in = row["compared_to"]
            else:
                words[i][j] = CELL_WORDS.get(row.get("verdict") or row.get("status"), "-")
        first = next(r for (c, _), r in by.items() if c == case)
        labels.append(case_phrase(first) + (f"  [vs {stand_in}]" if stand_in else ""))
    limit = min(2.0, max(math.log10(2.0), float(np.nanmax(np.abs(log_speed)))))
    norm = Normalize(-limit, limit)
    cmap = colormaps["RdYlGn"]
    colours = np.ones((len(cases), len(columns), 4))  # white where there is no number
    for i, j in zip(*np.nonzero(~np.isnan(log_speed))):
        colours[i, j] = (0.87, 0.87, 0.87, 1.0) if no_difference[i, j] else \
            cmap(norm(log_speed[i, j]))
    label_width = 0.075 * max(len(t) for t in labels) + 0.3  # inches at 8 pt
    cell_width = min(0.75, (MAX_WIDTH_PX / DPI - label_width - 1.2) / len(columns))
    fig = _new_figure(label_width + cell_width * len(columns) + 1.2, 1.4 + 0.22 * len(cases))
    ax = fig.subplots()
    ax.imshow(colours, aspect="auto", interpolation="nearest")
    for i in range(len(cases)):
        for j in range(len(columns)):
            if not words[i][j]:
                continue
            r, g, b, _ = colours[i, j]
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.45  # white text on dark cells
            ax.text(j, i, words[i][j], ha="center", va="center", fontsize=7.5,
                    color="white" if dark else "black",
                    style="italic" if np.isnan(log_speed[i, j]) else "normal")
    ax.set_xticks(range(len(columns)), columns, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(cases)), labels, fontsize=8)
    ax.tick_params(which="both", length=0)
    ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(cases) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    for side in ax.spines.values():
        side.set_visible(False)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02, aspect=30,
                       shrink=min(1.0, 6 / len(cases) + 0.3))
    ticks = [t for t in (-2, -1, -math.log10(2), 0, math.log10(2), 1, 2) if abs(t) <= limit + 1e-9]
    bar.set_ticks(ticks, labels=[_speed_label(10 ** t) for t in ticks], fontsize=8)
    bar.set_label(f"speed-up over {baseline} (log scale)", fontsize=8)
    ax.set_title(f"{finding}: speed-up over {baseline} per case and variant", fontsize=10)
    return _save(fig, folder, f"{finding}-speedup-map.png", f"Speed-up over {baseline}",
                 f"Each cell: the median time of {baseline} over that of the variant, at "
                 "that case (green: faster, red: slower, on a log scale; grey: no measurable "
                 "difference, the 95% interval contains 1). A row marked [vs X] did not time "
                 f"{baseline}: its cells are over X, marked ref. skip: not timed, ERROR: "
                 "raised, FAIL: wrong output, CUDA: needs a GPU (the table below says why).")


def history_figure(finding: str, points: pd.DataFrame, machines: list[int], baseline: str,
                   folder: Path) -> Figure | None:
    """Across runs (x, in commit-time order): the speed-up over the baseline at the
    headline case with its 95% interval (left) and the median times (right), one line per
    variant, one row of panels per machine; rings mark the first run of a new level (a
    change point, `harness.report.changepoints`)."""
    rows = points[points["finding"] == finding]
    if rows.empty or rows["median_s"].isna().all():
        return None
    shown = [m for m in machines if m in set(rows["machine"])]
    variants = list(dict.fromkeys(rows["variant"]))
    colours = _colours(variants)
    fig = _new_figure(MAX_WIDTH_PX / DPI, 0.6 + 3.0 * len(shown))
    axes = np.atleast_2d(fig.subplots(len(shown), 2, squeeze=False))
    orders = sorted(rows["order"].unique())
    labels = {r["order"]: (r["commit"][:7] or "?") + ("*" if r["dirty"] else "")
              for r in rows.to_dict("records")}
    stride = max(1, math.ceil(len(orders) / 6))  # at most six commit labels a panel
    for (ratio_ax, time_ax), machine in zip(axes, shown):
        mine = rows[rows["machine"] == machine]
        for variant in variants:
            v = mine[mine["variant"] == variant].sort_values("order")
            timed = v[v["median_s"].notna()]
            if not timed.empty:
                time_ax.plot(timed["order"], timed["median_s"], marker="o", markersize=4,
                             color=colours[variant], label=variant)
                steps = timed[timed["time_step"]]
                time_ax.scatter(steps["order"], steps["median_s"], s=110, facecolors="none",
                                edgecolors="black", linewidths=1.3, zorder=3, label="new level")
            compared = v[v["ratio"].notna()]
            if variant == baseline or compared.empty:
                continue
            speed = 1.0 / compared["ratio"].to_numpy(float)
            err = [speed - 1.0 / compared["ci_high"].to_numpy(float),
                   1.0 / compared["ci_low"].to_numpy(float) - speed]
            ratio_ax.errorbar(compared["order"], speed, yerr=err, marker="o", markersize=4,
                              capsize=2, color=colours[variant], label=variant)
            steps = compared[compared["ratio_step"]]
            ratio_ax.scatter(steps["order"], 1.0 / steps["ratio"].to_numpy(float), s=110,
                             facecolors="none", edgecolors="black", linewidths=1.3, zorder=3,
                             label="new level")
        ratio_ax.axhline(1.0, color="black", linewidth=0.8)
        for ax, scale_label in ((ratio_ax, lambda v: f"{v:g}x"), (time_ax, format_seconds)):
            ax.set_yscale("log")
            _log_labels(ax.yaxis, ax.get_ylim(), scale_label)
            ticks = orders[::stride]
            ax.set_xticks(ticks, [labels[t] for t in ticks], fontsize=8)
            ax.set_xlim(orders[0] - 0.5, orders[-1] + 0.5)
            ax.grid(True, which="major", alpha=0.3)
        ratio_ax.set_title(f"machine {machine}: speed-up over {baseline}", fontsize=9)
        time_ax.set_title(f"machine {machine}: median time per call", fontsize=9)
    axes[-1][0].set_xlabel("commit (in commit-time order; * uncommitted changes)")
    axes[-1][1].set_xlabel("commit")
    legend = {}
    for ax in axes.ravel():
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="outside right upper", fontsize=8)
    fig.suptitle(f"{finding} across runs, at {rows['where'].iloc[0]}", fontsize=10)
    return _save(fig, folder, f"{finding}-history.png", f"{finding} across runs",
                 f"Left: how many times faster than {baseline} each variant is, with its 95% "
                 "interval; right: the median times behind it. One line per variant, one row "
                 "per machine; rings: the first run of a new level (a change point, see the method "
                 "above).")
