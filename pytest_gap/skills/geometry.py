"""Small geometry: oriented boxes from point clouds, rotations for a top-down gripper."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel


class Box(BaseModel):
    """An oriented bounding box resting upright: yaw about world z, half extents in its frame."""

    center: tuple[float, float, float]
    half_extents: tuple[float, float, float]
    yaw: float  # radians, the box's x axis in the table plane

    @property
    def top(self) -> float:
        return self.center[2] + self.half_extents[2]

    @property
    def bottom(self) -> float:
        return self.center[2] - self.half_extents[2]

    def contains(self, point, margin: float = 0.0) -> bool:
        local = _rot_z(-self.yaw) @ (np.asarray(point, float) - np.asarray(self.center))
        return bool(np.all(np.abs(local) <= np.asarray(self.half_extents) + margin))


def _rot_z(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def min_area_yaw(xy: np.ndarray, step_deg: float = 1.0) -> float:
    """The yaw of the smallest-area rectangle around points in the plane.

    Square-ish things (a basket) have no clear principal axis: PCA may miss their sides by
    several degrees, which a rectangle hugging the points does not."""
    best, best_area = 0.0, np.inf
    for yaw in np.deg2rad(np.arange(0.0, 90.0, step_deg)):
        area = _rect_area(xy, yaw)
        if area < best_area:
            best, best_area = float(yaw), area
    return best


def _rect_area(xy: np.ndarray, yaw: float) -> float:
    c, s = np.cos(yaw), np.sin(yaw)
    return float(np.ptp(xy @ np.array([c, s])) * np.ptp(xy @ np.array([-s, c])))


def _pca_yaw(xy: np.ndarray) -> float:
    mean = xy.mean(axis=0)
    cov = np.cov((xy - mean).T) if len(xy) > 2 else np.eye(2)
    _, vecs = np.linalg.eigh(cov)
    major = vecs[:, 1]
    return float(np.arctan2(major[1], major[0]))


def fit_yaw(xy: np.ndarray) -> float:
    """The yaw of an object's box: along the principal axis, unless a rectangle turned
    otherwise is clearly (10%) smaller.

    A square carton has no principal axis: PCA turns its box by up to 45 degrees, and a grasp
    across that box closes on the corners. A round can has no smaller rectangle, and keeps
    the principal axis its grasps were tuned on."""
    pca = _pca_yaw(xy)
    tight = min_area_yaw(xy)
    return tight if _rect_area(xy, tight) < 0.9 * _rect_area(xy, pca) else pca


def box_from_points(
    points: np.ndarray, floor: float | None = None, yaw: float | None = None
) -> Box:
    """Upright OBB of a point cloud: turned by `fit_yaw` in the table plane (or the given
    `yaw`), z from the support to the top.

    The underside of a resting object is never seen, so the box extends down to `floor` (the
    height of the surface around it, `support_height`) when the lowest visible point is within
    3 cm of it; without a floor it starts at the lowest visible point.
    """
    xy = points[:, :2]
    mean = xy.mean(axis=0)
    if yaw is None:
        yaw = fit_yaw(xy)
    local = (xy - mean) @ np.array([[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]])
    lo, hi = local.min(axis=0), local.max(axis=0)
    mid = (lo + hi) / 2
    center_xy = mean + _rot_z(yaw)[:2, :2] @ mid
    z_lo, z_hi = float(points[:, 2].min()), float(points[:, 2].max())
    # A support above the lowest point seen is not under it (a neighbour's top): ignore it.
    if floor is not None and -0.005 < z_lo - floor < 0.03:
        z_lo = floor
    return Box(
        center=(float(center_xy[0]), float(center_xy[1]), (z_lo + z_hi) / 2),
        half_extents=(float((hi - lo)[0] / 2), float((hi - lo)[1] / 2), (z_hi - z_lo) / 2),
        yaw=yaw,
    )


def support_height(
    points: np.ndarray, around: np.ndarray, gap: float = 0.01, ring: float = 0.04
) -> float | None:
    """The height of the surface an object stands on, from what is seen around its footprint
    (`around`: points of everything but the object and the robot) in a ring from `gap` to
    `gap + ring` outside its outline's bounding circle, below its top: the lowest level (1 cm
    thick) that holds a quarter of those points, its median.

    Lowest: a neighbour or the wall of a container next to it stands above the surface, and
    may fill most of the ring. A quarter: beyond a table's edge the floor far below shows in a
    few points. None when too little is seen there (held up in the air with nothing near)."""
    center = np.median(points[:, :2], axis=0)
    radius = float(np.max(np.linalg.norm(points[:, :2] - center, axis=1)))
    if not len(around):
        return None
    dist = np.linalg.norm(around[:, :2] - center, axis=1)
    near = (
        (dist > radius + gap) & (dist < radius + gap + ring) & (around[:, 2] < points[:, 2].max())
    )
    z = np.sort(around[near, 2])
    if len(z) < 20:
        return None
    # Points within 5 mm of each: the lowest that has a quarter of the ring's about it.
    counts = np.searchsorted(z, z + 0.005) - np.searchsorted(z, z - 0.005)
    dense = np.nonzero(counts >= 0.25 * len(z))[0]
    if not len(dense):
        return float(np.median(z))
    level = z[dense[0]]
    return float(np.median(z[np.abs(z - level) < 0.005]))


def container_frame(
    points: np.ndarray, rim_xy: np.ndarray, floor: float | None = None, turn: float = 0.0
) -> Box:
    """A container's box in its own frame, from its points and those of its rim: yaw from the
    least-area rectangle around the rim, turned so the frame's y axis runs along the longer
    side (the convention `packing` fills rows by), then by `turn` (an asset's half turn,
    `calibration`).

    The rim alone: what stands inside hides parts of the walls, and the rest can turn the
    least-area box by tens of degrees. A rectangle's yaw is known up to a quarter turn; the
    longer side settles that to a half turn, so a container at any yaw gets the same frame
    on its own body, up to a half turn."""
    yaw = min_area_yaw(rim_xy)
    c, s = np.cos(yaw), np.sin(yaw)
    if np.ptp(rim_xy @ np.array([c, s])) > np.ptp(rim_xy @ np.array([-s, c])):
        yaw += np.pi / 2
    box = box_from_points(points, floor=floor, yaw=wrap_angle(yaw))
    # A half turn leaves an upright box's centre and extents as they are.
    return box.model_copy(update={"yaw": wrap_angle(box.yaw + turn)})


def wrap_angle(angle: float) -> float:
    """Map an angle to [-pi, pi)."""
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


def wrap_half_turn(angle: float) -> float:
    """Map an angle to (-pi/2, pi/2]: a parallel gripper is symmetric under half turns."""
    angle = (angle + np.pi / 2) % np.pi - np.pi / 2
    return float(angle if angle > -np.pi / 2 else angle + np.pi)


def down_rotation(yaw: float) -> np.ndarray:
    """Hand orientation pointing down, rotated by `yaw` about world z.

    At yaw 0 this is LIBERO's start pose: hand z down, hand y along world -y. The Panda's
    fingers close along the hand's y axis.
    """
    return _rot_z(yaw) @ np.diag([1.0, -1.0, -1.0])


def rotation_error(current: np.ndarray, desired: np.ndarray) -> np.ndarray:
    """World-frame axis-angle vector rotating `current` onto `desired`."""
    r = desired @ current.T
    angle = np.arccos(np.clip((np.trace(r) - 1) / 2, -1.0, 1.0))
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    norm = np.linalg.norm(axis)
    if norm < 1e-9:  # a half turn: pick the axis from the symmetric part
        w, v = np.linalg.eigh((r + np.eye(3)) / 2)
        axis = v[:, np.argmax(w)]
        norm = 1.0
    return axis / norm * angle


def quat_xyzw_to_matrix(q) -> np.ndarray:
    x, y, z, w = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def world_half_extents(box: Box) -> tuple[float, float]:
    """Half extents (x, y) of the axis-aligned rectangle around a box's footprint."""
    c, s = abs(np.cos(box.yaw)), abs(np.sin(box.yaw))
    hx, hy = box.half_extents[:2]
    return float(hx * c + hy * s), float(hx * s + hy * c)


def beside(anchor: Box, item: Box, axis: int, sign: float, gap: float) -> tuple[float, float]:
    """Where (x, y) to stand `item` next to `anchor` along world `axis` on the `sign` side:
    the footprints `gap` apart, centred on the anchor across that axis."""
    a, b = world_half_extents(anchor), world_half_extents(item)
    point = [anchor.center[0], anchor.center[1]]
    point[axis] += sign * (a[axis] + b[axis] + gap)
    return float(point[0]), float(point[1])


SPOT_CELL = 0.005  # the grid free spots are searched on, and footprints sampled at


def rect_samples(half_xy, yaw: float, center=(0.0, 0.0)) -> np.ndarray:
    """Points (N, 2) every SPOT_CELL over a rectangle of half extents `half_xy` turned by
    `yaw` about `center`, its edges included."""
    hx, hy = (max(float(h), 0.0) for h in half_xy)
    u = np.linspace(-hx, hx, max(2, int(np.ceil(2 * hx / SPOT_CELL)) + 1))
    v = np.linspace(-hy, hy, max(2, int(np.ceil(2 * hy / SPOT_CELL)) + 1))
    grid = np.stack(np.meshgrid(u, v), axis=-1).reshape(-1, 2)
    c, s = np.cos(yaw), np.sin(yaw)
    return grid @ np.array([[c, s], [-s, c]]) + np.asarray(center, float)[:2]


def _codes(cells: np.ndarray) -> np.ndarray:
    """Integer grid cells (N, 2) as one int each, for set lookups."""
    return (cells[:, 0].astype(np.int64) + 100_000) * 200_001 + cells[:, 1] + 100_000


def _within(gap: float) -> np.ndarray:
    """The grid offsets (N, 2) within `gap` of a cell, one cell's rounding included."""
    r = int(np.ceil(gap / SPOT_CELL))
    ij = np.stack(np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1)), -1).reshape(-1, 2)
    return ij[np.linalg.norm(ij, axis=1) * SPOT_CELL < gap + SPOT_CELL / 2]


def _cells(points: np.ndarray) -> np.ndarray:
    """Points (N, 2) as the grid cells they fall in, once each."""
    cells = np.round(np.asarray(points, float).reshape(-1, 2) / SPOT_CELL).astype(int)
    return np.unique(cells, axis=0)


def _sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Minkowski sum of two sets of grid cells (N, 2), (M, 2): every a + b, once.

    The larger set as a raster, OR-ed in at each offset of the smaller: a few hundred slices
    of a few thousand cells. (Not scipy.signal: importing it costs a second per process, and
    its C modules cannot be imported twice in one process, as pytester's inner sessions do.)"""
    if not len(a) or not len(b):
        return np.zeros((0, 2), int)
    if len(b) > len(a):
        a, b = b, a
    lo_a, lo_b = a.min(axis=0), b.min(axis=0)
    raster, _ = _raster(a)
    offsets = b - lo_b
    h, w = raster.shape
    out = np.zeros((h + offsets[:, 0].max(), w + offsets[:, 1].max()), bool)
    for di, dj in offsets:
        out[di : di + h, dj : dj + w] |= raster
    return np.argwhere(out) + lo_a + lo_b


def _raster(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A set of grid cells as a boolean raster and the cell its [0, 0] stands for."""
    lo = cells.min(axis=0)
    mask = np.zeros(tuple(cells.max(axis=0) - lo + 1), bool)
    mask[tuple((cells - lo).T)] = True
    return mask, lo


def _blocked(fixed: np.ndarray, shape: np.ndarray, near: np.ndarray) -> np.ndarray:
    """The cells (codes) where putting `shape` (cells relative to its centre) brings it within
    the gap (`near`, `_within`) of a `fixed` cell: fixed - shape + near."""
    return _codes(_sum(_sum(fixed, -shape), near))


def _least_blocked(
    cells: np.ndarray, codes: np.ndarray, fixed: np.ndarray, mine: np.ndarray, near: np.ndarray
) -> np.ndarray:
    """The spot (x, y) among `cells` (their `codes`) where the fewest `fixed` cells are in the
    way of the footprint `mine` kept the gap `near` clear: `plan_spot`'s answer when no spot
    is clear (the first such spot on a tie)."""
    # How many fixed cells are in the way of the footprint put at each spot.
    spread = _sum(mine, near)
    hit, count = np.unique(
        _codes((fixed[:, None] - spread[None]).reshape(-1, 2)), return_counts=True
    )
    lookup = dict(zip(hit.tolist(), count.tolist(), strict=True))
    counts = [lookup.get(c, 0) for c in codes.tolist()]
    return cells[int(np.argmin(counts))] * SPOT_CELL


def free_spot(
    center,
    reach,
    occupied: np.ndarray,
    footprint: np.ndarray,
    later=(),
    gap: float = 0.01,
    toward=None,
) -> tuple[np.ndarray, bool]:
    """Where to put an item's centre on a surface some things already stand on: the spot
    within `reach` (x, y half extents, world axes) of `center` where its `footprint` (N, 2,
    relative to its centre) comes no nearer than `gap` to any `occupied` point (M, 2), and
    each item still to come there (`later`: per item, the footprints it may stand with) finds
    such a spot after it, as near the centre as all of them can be (the sum of their
    distances from it). (spot, True); the centre itself when it is clear and nothing is to
    come; (the spot with the fewest points in the way, False) when none is clear.

    `toward`: a point (x, y) to rank by instead of the centre, the spots nearest it first (the
    robot's base, where the centre is beyond the arm's easy reach: `on_support._free_spot`)."""
    spot, clear, _ = plan_spot(center, reach, occupied, footprint, later, gap, toward)
    return spot, clear


def plan_spot(
    center,
    reach,
    occupied: np.ndarray,
    footprint: np.ndarray,
    later=(),
    gap: float = 0.01,
    toward=None,
) -> tuple[np.ndarray, bool, float]:
    """`free_spot`, and what its plan costs: the sum of the distances (from the centre, or
    from `toward`) of the spot and of those the items to come find after it; infinite when
    the spot is not clear or they find no room. Costs compare footprints turned otherwise
    (`on_support._free_spot` turns what it holds to make room)."""
    center = np.asarray(center, float)[:2]
    rank_from = center if toward is None else np.asarray(toward, float)[:2]
    reach = np.maximum(np.asarray(reach, float)[:2], 0.0)
    steps = [np.arange(-int(r / SPOT_CELL), int(r / SPOT_CELL) + 1) for r in reach]
    ij = np.stack(np.meshgrid(*steps), axis=-1).reshape(-1, 2)
    cells = ij + np.round(center / SPOT_CELL).astype(int)
    # Nearest the centre first (then, given `toward`, nearest it; the centre's order on ties).
    cells = cells[np.argsort(np.linalg.norm(ij, axis=1), kind="stable")]
    distance = np.linalg.norm(cells * SPOT_CELL - rank_from, axis=1)
    if toward is not None:
        order = np.argsort(distance, kind="stable")
        cells, distance = cells[order], distance[order]
    codes = _codes(cells)
    near = _within(gap)
    fixed, mine = _cells(occupied), _cells(footprint)
    ok = ~np.isin(codes, _blocked(fixed, mine, near))
    if not ok.any():
        return _least_blocked(cells, codes, fixed, mine, near), False, np.inf
    first = int(np.argmax(ok))
    if not later:
        return cells[first] * SPOT_CELL, True, float(distance[first])
    options = [[_cells(shape) for shape in shapes] for shapes in later]
    shapes = [mine] + [o for item in options for o in item]
    # Where each later shape may go for what stands there now; and relative to each shape
    # put down before it, the offsets it must keep clear of (as cells).
    free_now = [~np.isin(codes, _blocked(fixed, s, near)) for s in shapes]
    pairs = {
        (i, j): _raster(_sum(_sum(shapes[i], -shapes[j]), near))
        for i in range(len(shapes))
        for j in range(1, len(shapes))
        if i != j
    }
    index = {id(s): n for n, s in enumerate(shapes)}

    def room(j: int, placed: list[tuple[int, np.ndarray]]) -> np.ndarray:
        free = free_now[j].copy()
        for i, at in placed:
            mask, lo = pairs[(i, j)]
            rel = cells - at - lo
            inside = np.all((rel >= 0) & (rel < mask.shape), axis=1)
            free[inside] &= ~mask[tuple(rel[inside].T)]
        return free

    best, best_cost = cells[first] * SPOT_CELL, np.inf
    for k in np.flatnonzero(ok):
        if distance[k] >= best_cost:
            break  # nearest first: nothing further on can do better
        placed, cost = [(0, cells[k])], float(distance[k])
        for item in options:
            found = None
            for shape in item:
                j = index[id(shape)]
                free = room(j, placed)
                at = int(np.argmax(free))
                if free[at] and (found is None or distance[at] < found[0]):
                    found = (float(distance[at]), at, j)
            if found is None:
                cost = np.inf
                break
            cost += found[0]
            placed.append((found[2], cells[found[1]]))
        if cost < best_cost:
            best, best_cost = cells[k] * SPOT_CELL, cost
    return best, True, best_cost
