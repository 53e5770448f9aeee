"""Binary search for the first changed commit, as `git bisect` does, over decisions.

Pure: `first_change(count, decide)` knows commits only by their index in the list of
candidates, oldest first, the last one the bad commit (already known to have changed; the
good commit, before index 0, already known not to have). `decide(index)` measures one
commit and says GOOD (not changed), BAD (changed), SKIP (cannot be measured: the finding
is missing or does not import there) or UNDECIDED (measured twice and still
inconclusive). A skipped commit is stepped around, trying its open neighbours nearest the
middle first, as `git bisect skip` does; an undecided one ends the search there, rather
than guessing.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field


class Decision(str, enum.Enum):
    """What one measured commit says, against the good commit."""

    GOOD = "good"
    """Not changed: the same as the good commit."""
    BAD = "bad"
    """Changed, as the bad commit is."""
    SKIP = "skip"
    """Cannot be measured (the finding is missing or does not import there)."""
    UNDECIDED = "undecided"
    """Measured twice, still inconclusive (timing only)."""


@dataclass(frozen=True)
class Found:
    """Where the search ended: candidates `last_good` + 1 .. `first_bad` hold the change.

    Indices are into the candidates (oldest first, the bad commit last); -1 is the good
    commit itself. The change is pinned to one commit when `first_bad == last_good + 1`.
    """

    last_good: int
    first_bad: int
    tested: tuple[tuple[int, Decision], ...]
    """Every commit measured, in order, with its decision."""
    undecided: int | None = None
    """The commit that stopped the search, measured twice and inconclusive; None if none."""
    skipped: tuple[int, ...] = field(default=())

    @property
    def pinned(self) -> bool:
        """Whether one commit is named: no skipped or undecided commit hides the answer."""
        return self.undecided is None and self.first_bad == self.last_good + 1


def expected_steps(count: int) -> int:
    """Decisions a search over `count` candidates takes without skips: log2 of the commits
    between the good and the bad one, rounded up (0 when they are adjacent)."""
    return math.ceil(math.log2(count)) if count > 1 else 0


def _next(last_good: int, first_bad: int, skipped: set[int]) -> int | None:
    """The open commit between the two nearest the middle (lower first), or None."""
    middle = (last_good + first_bad) // 2
    open_ = [i for i in range(last_good + 1, first_bad) if i not in skipped]
    return min(open_, key=lambda i: (abs(i - middle), i)) if open_ else None


def first_change(count: int, decide: Callable[[int], Decision]) -> Found:
    """Search candidates 0 .. `count` - 1 (the last is the bad commit) for the first one
    that changed; see the module docstring."""
    if count < 1:
        raise ValueError(f"count: expected at least 1 candidate (the bad commit); got {count}")
    last_good, first_bad = -1, count - 1
    skipped: set[int] = set()
    tested: list[tuple[int, Decision]] = []
    while (index := _next(last_good, first_bad, skipped)) is not None:
        decision = decide(index)
        tested.append((index, decision))
        if decision is Decision.GOOD:
            last_good = index
        elif decision is Decision.BAD:
            first_bad = index
        elif decision is Decision.SKIP:
            skipped.add(index)
        else:
            return Found(last_good, first_bad, tuple(tested), undecided=index,
                         skipped=tuple(sorted(skipped)))
    hidden = tuple(sorted(i for i in skipped if last_good < i < first_bad))
    return Found(last_good, first_bad, tuple(tested), skipped=hidden)
