"""Privileged access to a live LIBERO scene, for skills and for scoring.

Everything here reads simulator state (names, poses, geometry, contacts, rendered depth and
segmentation); nothing here moves anything. Quaternions are (w, x, y, z) unless a name says
otherwise; lengths are metres in the world frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pytest_gap.errors import SimInputError
from pytest_gap.sim.render import CameraFrame, SceneRenderer, resolve_camera

ROBOT_LABEL = "robot"
_ROBOT_BODY_PREFIXES = ("robot0_", "gripper0_", "mount0_")


@dataclass(frozen=True)
class SceneObject:
    name: str
    category: str
    fixture: bool


@dataclass(frozen=True)
class Pose:
    pos: np.ndarray
    quat: np.ndarray  # w, x, y, z

    @property
    def matrix(self) -> np.ndarray:
        import mujoco

        mat = np.zeros(9)
        mujoco.mju_quat2Mat(mat, self.quat)
        return mat.reshape(3, 3)


@dataclass(frozen=True)
class Region:
    name: str
    pos: np.ndarray
    half_size: np.ndarray


@dataclass(frozen=True)
class GripperState:
    eef_pos: np.ndarray  # grip site between the fingertips
    hand_quat_xyzw: np.ndarray  # hand body; its y axis is the fingers' closing axis
    finger_qpos: np.ndarray  # (left, right), each about +-0.04 when open
    width: float  # distance between the fingers
    max_width: float = 0.08  # the widest the fingers open (their joint ranges; Panda: 0.08 m)

    @property
    def closed(self) -> bool:
        return self.width < 0.005


@dataclass(frozen=True)
class Contact:
    a: str
    b: str
    pos: np.ndarray
    distance: float  # negative = penetration


def _subtree_bodies(model, root: int) -> list[int]:
    bodies = []
    for body in range(model.nbody):
        walk = body
        while walk not in (root, 0):
            walk = int(model.body_parentid[walk])
        if walk == root:
            bodies.append(body)
    return bodies


class SceneView:
    """Read-only queries over one robosuite/LIBERO env (the object behind ControlEnv.env)."""

    def __init__(self, raw_env, egl_device: int | None = None):
        self._env = raw_env
        self._egl_device = egl_device  # where its cameras render (see sim/gl.py)
        self._model = raw_env.sim.model._model
        self._data = raw_env.sim.data._data
        problem = raw_env.parsed_problem
        categories = {}
        for group, fixture in ((problem["objects"], False), (problem["fixtures"], True)):
            for category, names in group.items():
                for name in names:
                    categories[name] = (category, fixture)
        self._objects: dict[str, SceneObject] = {}
        self._geoms: dict[str, np.ndarray] = {}
        self._root_body: dict[str, int] = {}
        body_owner: dict[int, str] = {}
        for name, mj_obj in {**raw_env.fixtures_dict, **raw_env.objects_dict}.items():
            category, fixture = categories.get(name, (name, name in raw_env.fixtures_dict))
            root = self._model.body(mj_obj.root_body).id
            bodies = _subtree_bodies(self._model, root)
            for body in bodies:
                body_owner[body] = name
            geoms = np.flatnonzero(np.isin(self._model.geom_bodyid, bodies))
            self._objects[name] = SceneObject(name, category, fixture)
            self._geoms[name] = geoms
            self._root_body[name] = root
        for body in range(self._model.nbody):
            if self._model.body(body).name.startswith(_ROBOT_BODY_PREFIXES):
                body_owner.setdefault(body, ROBOT_LABEL)
        self._body_owner = body_owner
        names = [*self._objects, ROBOT_LABEL]
        self._labels = {i + 1: n for i, n in enumerate(names)}
        index = {n: i for i, n in self._labels.items()}
        owners = [body_owner.get(int(b)) for b in self._model.geom_bodyid]
        self._geom_labels = np.array([index.get(o, 0) for o in owners], dtype=np.int32)
        self._renderer: SceneRenderer | None = None
        self._fingers: tuple[np.ndarray, np.ndarray] | None = None
        self._geom_sets: dict[tuple[str, ...], np.ndarray] = {}

    # -- objects -----------------------------------------------------------------------------
    def objects(self, *, include_fixtures: bool = True) -> list[SceneObject]:
        return [o for o in self._objects.values() if include_fixtures or not o.fixture]

    def object(self, name: str) -> SceneObject:
        if name not in self._objects:
            raise SimInputError(
                f"unknown scene object {name!r}: this scene has {sorted(self._objects)}"
            )
        return self._objects[name]

    def pose(self, name: str) -> Pose:
        body = self._root_body[self.object(name).name]
        return Pose(self._data.xpos[body].copy(), self._data.xquat[body].copy())

    def _collision_geoms(self, name: str) -> np.ndarray:
        geoms = self._geoms[self.object(name).name]
        solid = (self._model.geom_contype[geoms] != 0) | (self._model.geom_conaffinity[geoms] != 0)
        return geoms[solid] if solid.any() else geoms

    def _geom_corners(self, name: str) -> np.ndarray:
        """World coordinates of the 8 corners of every collision geom's bounding box."""
        signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)
        corners = []
        for g in self._collision_geoms(name):
            center, half = self._model.geom_aabb[g, :3], self._model.geom_aabb[g, 3:]
            local = center + signs * half
            rot = self._data.geom_xmat[g].reshape(3, 3)
            corners.append(local @ rot.T + self._data.geom_xpos[g])
        return np.concatenate(corners)

    def world_aabb(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        corners = self._geom_corners(name)
        return corners.min(axis=0), corners.max(axis=0)

    def extents(self, name: str) -> np.ndarray:
        """Half sizes (3,) of the object's collision geometry in its own body frame."""
        pose = self.pose(name)
        local = (self._geom_corners(name) - pose.pos) @ pose.matrix
        return (local.max(axis=0) - local.min(axis=0)) / 2.0

    def region(self, name: str) -> Region:
        """A BDDL region site, e.g. `basket_1_contain_region`."""
        sites = self._env.object_sites_dict
        if name not in sites:
            raise SimInputError(f"unknown region {name!r}: this scene has {sorted(sites)}")
        site = self._model.site(sites[name].name)
        return Region(name, self._data.site_xpos[site.id].copy(), self._model.site_size[site.id])

    def goal_state(self) -> list[tuple[str, ...]]:
        """The BDDL goal's conjuncts, e.g. ('in', 'milk_1', 'basket_1_contain_region')."""
        return [tuple(p) for p in self._env.parsed_problem["goal_state"]]

    def camera_position(self, camera: str) -> np.ndarray:
        cam = self._model.camera(resolve_camera(self._model, camera))
        return self._data.cam_xpos[cam.id].copy()

    # -- robot -------------------------------------------------------------------------------
    def gripper(self) -> GripperState:
        robot = self._env.robots[0]
        hand = self._model.body(robot.robot_model.eef_name).id
        wxyz = self._data.xquat[hand]
        fingers = self._data.qpos[robot._ref_gripper_joint_pos_indexes].copy()
        left, right = (self._model.joint(name).range for name in robot.gripper.joints[:2])
        return GripperState(
            eef_pos=self._data.site_xpos[robot.eef_site_id].copy(),
            hand_quat_xyzw=np.array([wxyz[1], wxyz[2], wxyz[3], wxyz[0]]),
            finger_qpos=fingers,
            width=float(fingers[0] - fingers[1]),
            max_width=float(left[1] - right[0]),
        )

    def gripper_command(self) -> float:
        """The gripper command the robot executes now, -1 open to +1 closed: robosuite's
        `format_action` ramps it toward the sign of the action's gripper entry (the Panda by
        its `speed` a step), so it lags the action by a few steps after each switch."""
        return float(np.ravel(self._env.robots[0].gripper.current_action)[-1])

    # -- contacts ----------------------------------------------------------------------------
    def owner_of_geom(self, geom: int) -> str:
        body = int(self._model.geom_bodyid[geom])
        return self._body_owner.get(body) or self._model.body(body).name or f"body{body}"

    def contacts(self, name: str | None = None) -> list[Contact]:
        """Active contacts between distinct owners (objects, `robot`, or body names)."""
        out = []
        for c in self._data.contact[: self._data.ncon]:
            a, b = self.owner_of_geom(c.geom1), self.owner_of_geom(c.geom2)
            if a == b or (name is not None and name not in (a, b)):
                continue
            out.append(Contact(a, b, c.pos.copy(), float(c.dist)))
        return out

    def touching(self, a: str, b: str) -> bool:
        return any({c.a, c.b} == {a, b} for c in self.contacts(a))

    def grasped(self) -> str | None:
        """The movable object the fingers hold now, or None: one that touches a geom of each
        finger (robosuite's own grasp test, `_check_grasp`, reads the same finger geoms).
        Fingers closed on nothing, or pushing an object with one finger, hold nothing."""
        if self._data.ncon == 0:
            return None
        contact = self._data.contact  # the active contacts only
        g1, g2 = np.asarray(contact.geom1), np.asarray(contact.geom2)
        sides = []
        for finger in self._finger_masks():
            others = np.concatenate([g2[finger[g1]], g1[finger[g2]]])
            sides.append(set(self._geom_labels[others].tolist()))
        held = (self._labels.get(i) for i in sides[0] & sides[1])
        movable = sorted(n for n in held if n in self._objects and not self._objects[n].fixture)
        return movable[0] if movable else None

    def _finger_masks(self) -> tuple[np.ndarray, np.ndarray]:
        """Per geom id, whether it is the left finger's, the right finger's (robosuite's
        `important_geoms`)."""
        if self._fingers is None:
            fingers = self._env.robots[0].gripper.important_geoms
            masks = []
            for side in ("left_finger", "right_finger"):
                mask = np.zeros(self._model.ngeom, dtype=bool)
                mask[[self._model.geom(name).id for name in fingers[side]]] = True
                masks.append(mask)
            self._fingers = (masks[0], masks[1])
        return self._fingers

    def hand_distance(self, names) -> float:
        """Metres from the grip site to the nearest collision geom box of the named objects
        (0 touching one): how close the hand came to them, cheap enough for every step."""
        names = tuple(names)
        geoms = self._geom_sets.get(names)
        if geoms is None:  # the objects' geoms stay theirs: found once per set of names
            geoms = self._geom_sets[names] = np.concatenate(
                [self._collision_geoms(name) for name in names]
            )
        hand = self._data.site_xpos[self._env.robots[0].eef_site_id]
        center, half = self._model.geom_aabb[geoms, :3], self._model.geom_aabb[geoms, 3:]
        rot = self._data.geom_xmat[geoms].reshape(-1, 3, 3)
        # the hand in each geom's own frame, against its box there
        local = np.einsum("kji,kj->ki", rot, hand - self._data.geom_xpos[geoms]) - center
        outside = np.maximum(np.abs(local) - half, 0.0)
        return float(np.sqrt((outside**2).sum(axis=1)).min())

    # -- cameras -----------------------------------------------------------------------------
    @property
    def renderer(self) -> SceneRenderer:
        if self._renderer is None:
            self._renderer = SceneRenderer(
                self._model, self._data, self._geom_labels, self._labels, self._egl_device
            )
        return self._renderer

    def render(
        self,
        camera: str = "agentview",
        *,
        height: int = 256,
        width: int = 256,
        rgb: bool = True,
        depth: bool = True,
        segmentation: bool = True,
    ) -> CameraFrame:
        return self.renderer.frame(
            resolve_camera(self._model, camera),
            height,
            width,
            rgb=rgb,
            depth=depth,
            segmentation=segmentation,
        )

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
