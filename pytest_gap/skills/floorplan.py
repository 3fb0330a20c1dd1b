"""Will the rest still fit? A container's floor as an occupancy grid, and a first-fit trial
placement of the items still to come.

Pure geometry in the container's frame (centre at the origin, axes along its sides), used by
the slot planner to choose, among equally good slots for the item in hand, one that leaves
room for the others: packing item by item fills the floor greedily, and a carton set down
in the wrong corner can leave no room for the can that comes after it.
"""

from __future__ import annotations

import numpy as np

CELL = 0.002  # m: grid resolution (grocery items fill the basket to within a few mm)


class FloorGrid:
    """Which cells of a container's inner floor are taken."""

    def __init__(self, inner: np.ndarray, local_xy: np.ndarray, heights: np.ndarray, floor: float):
        """`inner`: half sizes of the usable floor; `local_xy`, `heights`: points seen inside
        (container frame); those above `floor` take their cell."""
        self.inner = np.asarray(inner, float)
        self.shape = tuple(int(n) for n in np.maximum(np.floor(2 * self.inner / CELL), 1))
        self.taken = np.zeros(self.shape, bool)
        above = heights > floor + CELL
        idx = self._index(local_xy[above])
        keep = np.all((idx >= 0) & (idx < self.shape), axis=1)
        self.taken[idx[keep, 0], idx[keep, 1]] = True

    def copy(self) -> FloorGrid:
        other = object.__new__(FloorGrid)
        other.inner, other.shape, other.taken = self.inner, self.shape, self.taken.copy()
        return other

    def _index(self, xy: np.ndarray) -> np.ndarray:
        return np.floor((np.asarray(xy, float).reshape(-1, 2) + self.inner) / CELL).astype(int)

    def take(self, center, half) -> None:
        """Mark a rectangle (container frame) as taken."""
        lo = self._index(np.asarray(center) - np.asarray(half))[0]
        hi = self._index(np.asarray(center) + np.asarray(half))[0]
        lo, hi = np.clip(lo, 0, self.shape), np.clip(hi + 1, 0, self.shape)
        self.taken[lo[0] : hi[0], lo[1] : hi[1]] = True

    def first_fit(self, half) -> tuple[float, float] | None:
        """Centre of the first free place for a rectangle of half sizes `half` (either way
        round), rows from the -y side first as the slot planner fills them; None if none."""
        best = None
        for h in (np.asarray(half, float), np.asarray(half, float)[::-1]):
            n = np.ceil(2 * h / CELL).astype(int)
            if np.any(n > self.shape):
                continue
            free = _free_windows(self.taken, n)
            if not free.any():
                continue
            rows, cols = np.nonzero(free)  # window origins (x index, y index)
            k = np.lexsort((-rows, cols))[0]  # lowest y row, then the +x end, as the planner
            corner = np.array([rows[k], cols[k]]) * CELL - self.inner
            place = (corner + n * CELL / 2, h)
            if best is None or (place[0][1], -place[0][0]) < (best[0][1], -best[0][0]):
                best = place
        if best is None:
            return None
        self.take(best[0], best[1])
        return float(best[0][0]), float(best[0][1])


def _free_windows(taken: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Boolean map over window origins: True where an n[0] x n[1] window has no taken cell."""
    sums = np.zeros((taken.shape[0] + 1, taken.shape[1] + 1), np.int32)
    sums[1:, 1:] = taken.cumsum(0, dtype=np.int32).cumsum(1)
    a, b = n
    window = sums[a:, b:] - sums[:-a, b:] - sums[a:, :-b] + sums[:-a, :-b]
    return window == 0


def fits(grid: FloorGrid, halves: list[tuple[float, float]], margin: float) -> int:
    """How many of the rectangles (half sizes, in packing order) still find floor, placed
    one after another first-fit; the grid is changed."""
    placed = 0
    for half in halves:
        if grid.first_fit(np.asarray(half) + margin) is not None:
            placed += 1
    return placed
