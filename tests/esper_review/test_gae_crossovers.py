"""esper_review.gae_tools.crossovers: proposals from hand-made timings (nothing is timed here)."""

from __future__ import annotations

from esper.gae.crossovers import UNBOUNDED
from esper_review.gae_tools.crossovers import Grid, main, propose_parallel_min, propose_rows, rows_source


def _grid(fast: dict) -> Grid:
    """shape -> {method: seconds}; `fast` maps a shape to its (first, second) methods."""
    medians = {}
    for shape, (first, second) in fast.items():
        medians[shape] = {first: 1.0, second: 2.0, **{m: 3.0 + i for i, m in enumerate(
            sorted({"a", "b", "c"} - {first, second}))}}
    return Grid(medians)


def _lookup(rows, num_envs, max_steps):
    return next(r for r in rows if num_envs <= r.max_envs and max_steps <= r.max_steps)


def test_proposed_rows_keep_the_first_two_choices_at_every_shape():
    fast = {(1, 25): ("a", "b"), (1, 1024): ("a", "b"), (64, 25): ("a", "b"),
            (64, 1024): ("a", "c"), (1024, 25): ("a", "c"), (1024, 1024): ("a", "c")}
    rows = propose_rows("cpu", _grid(fast))
    for (e, t), want in fast.items():
        assert _lookup(rows, e, t).ranking[:2] == want
    assert (rows[-1].max_envs, rows[-1].max_steps) == (UNBOUNDED, UNBOUNDED)
    assert len(rows) == 3  # (1, 1024) and (64, 25) kept; the large ones merge into the last
    assert "Crossover('cpu', UNBOUNDED, UNBOUNDED, ('a', 'c', 'b'), True)," in rows_source(rows)


def test_one_ranking_everywhere_is_one_row():
    rows = propose_rows("cpu", _grid({(4, 25): ("a", "b"), (1024, 256): ("a", "b")}))
    assert [(r.max_envs, r.max_steps) for r in rows] == [(UNBOUNDED, UNBOUNDED)]


def test_parallel_min_is_where_two_threads_win_from_there_up():
    results = {(4, 25): (1.0, 2.0), (64, 256): (2.0, 1.5), (16, 1024): (2.0, 2.5),
               (1024, 256): (5.0, 3.0), (1024, 1024): (9.0, 5.0)}
    assert propose_parallel_min(results) == 1024 * 256  # 16 x 1024 still lost
    assert propose_parallel_min({(4, 25): (1.0, 2.0)}) is None


def test_bad_threads_exit_2(capsys):
    assert main(["--threads", "0"]) == 2
    assert "--threads: expected an integer >= 1; got '0'" in capsys.readouterr().err
