"""The scene `bench/gpu_check.py` renders where LIBERO is not installed (a lent GPU machine):
a LIBERO scene cut to what fits the device's 64 MiB, drawing as many faces as the whole one.

A LIBERO scene compiled is 200-300 MB (libero_object task 0: 252 MB, 147 MB of it textures,
55 MB meshes), far over what travels to the device. So, built here from the real scene:
- kept: the robot, the table, the floor and walls, and the task's own two objects (for
  libero_object task 0 the alphabet soup and the basket), with their physics, so a control
  step costs what a LIBERO step costs in MuJoCo;
- left out: the other objects (their meshes and textures);
- every texture downsampled to at most TEXTURE_PX pixels a side (render cost is per pixel drawn
  and per face, not per texel, to first order; the texture bytes are what does not fit);
- visual-only copies of the task's object mesh (no collision, group 1: drawn by the harness's
  renderer, invisible to physics) stand where the left-out objects stood, until the faces the
  harness's renderer draws (group 1 meshes) reach the whole scene's count;
- a keyframe `episode_start`: the joints as the episode's reset left them (seed 0).
Saved as MuJoCo's binary model, xz-compressed (`.mjb.xz`; an .mjb is read by the same MuJoCo
version only: the packer carries that version's wheel), with a JSON beside it saying which
assets and how many faces.

    python bench/gpu_scene.py OUT.mjb.xz [--suite libero_object] [--task 0]
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import tempfile
from pathlib import Path

import numpy as np

TEXTURE_PX = 256
VISUAL_GROUP = 1  # what the harness's renderer draws (sim/render.py SceneRenderer)


def drawn_faces(model) -> int:
    """Faces of the mesh geoms the harness's renderer draws (group 1)."""
    import mujoco

    return int(
        sum(
            model.mesh_facenum[model.geom_dataid[g]]
            for g in range(model.ngeom)
            if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH
            and model.geom_group[g] == VISUAL_GROUP
        )
    )


def _object_bodies(model) -> list[str]:
    """The task's movable objects: bodies on a free joint, robot parts excluded."""
    import mujoco

    names = []
    for j in range(model.njnt):
        if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
            names.append(model.body(model.jnt_bodyid[j]).name)
    return names


def _downsample(spec, folder: Path) -> int:
    """Point every file texture at a copy at most TEXTURE_PX a side; returns how many."""
    from PIL import Image

    done = 0
    for i, texture in enumerate(spec.textures):
        if not texture.file:  # a builtin (flat, gradient): drawn from its colours at any size
            texture.width = min(texture.width, TEXTURE_PX)
            texture.height = min(texture.height, TEXTURE_PX)
            continue
        image = Image.open(texture.file).convert("RGB")
        scale = TEXTURE_PX / max(image.size)
        if scale < 1:
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, Image.Resampling.BILINEAR)
        path = folder / f"texture_{i}.png"
        image.save(path)
        texture.file = str(path)
        done += 1
    return done


def build(out: Path, suite: str = "libero_object", task: int = 0) -> dict:
    """Write the cut scene to `out` (.mjb) and its description beside it (.json)."""
    import mujoco

    from pytest_gap.sim.libero import make_env

    env = make_env(suite, task)
    try:
        env.reset(0)
        whole = env.raw.sim.model._model
        data = env.raw.sim.data._data
        xml = env.raw.model.get_xml()
        objects = _object_bodies(whole)
        named = _goal_names(env.goal)  # ("In", "alphabet_soup_1", "basket_1_contain_region")
        goal_objects = {
            name
            for name in objects
            if any(part.startswith(name.removesuffix("_main")) for part in named)
        }
        positions = {name: data.xpos[whole.body(name).id].copy() for name in objects}
        # The reset state by joint name, to start the cut scene where the episode starts.
        joints = {
            whole.joint(j).name: data.qpos[_qpos_slice(whole, j)].copy() for j in range(whole.njnt)
        }
        target = drawn_faces(whole)
        whole_bytes = _model_bytes(whole)
    finally:
        env.close()
    left_out = [name for name in objects if name not in goal_objects]
    spec = mujoco.MjSpec.from_string(xml)
    kept_meshes = _meshes_of(spec, goal_objects)
    for name in left_out:
        spec.delete(spec.body(name))
    _drop_unused_assets(spec)
    with tempfile.TemporaryDirectory() as tmp:
        n_textures = _downsample(spec, Path(tmp))
        model = spec.compile()
        copies = _fill_faces(spec, model, kept_meshes, [positions[n] for n in left_out], target)
        qpos = np.concatenate(
            [joints[model.joint(j).name] for j in range(model.njnt)] or [np.zeros(0)]
        )
        spec.add_key(name="episode_start", qpos=qpos)
        model = spec.compile()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".mjb") as raw:
        mujoco.mj_saveModel(model, raw.name, None)
        out.write_bytes(lzma.compress(Path(raw.name).read_bytes(), preset=6))
    about = {
        "source": f"{suite} task {task} (LIBERO, as the harness builds it)",
        "kept_objects": sorted(goal_objects),
        "left_out_objects": left_out,
        "visual_copies": copies,
        "textures_downsampled_to_px": TEXTURE_PX,
        "n_textures": n_textures,
        "drawn_faces_whole_scene": target,
        "drawn_faces": drawn_faces(model),
        "whole_scene_mjb_bytes": whole_bytes,
        "mjb_xz_bytes": out.stat().st_size,
        "mujoco": mujoco.__version__,
    }
    about_path(out).write_text(json.dumps(about, indent=1))
    return about


def _qpos_slice(model, joint: int) -> slice:
    import mujoco

    width = {mujoco.mjtJoint.mjJNT_FREE: 7, mujoco.mjtJoint.mjJNT_BALL: 4}.get(
        model.jnt_type[joint], 1
    )
    start = model.jnt_qposadr[joint]
    return slice(start, start + width)


def about_path(scene: Path) -> Path:
    """The JSON beside a scene: scene.mjb.xz -> scene.json."""
    return scene.with_name(scene.name.split(".")[0] + ".json")


def _goal_names(goal) -> list[str]:
    return [part for predicate in goal for part in predicate[1:] if isinstance(part, str)]


def _model_bytes(model) -> int:
    import mujoco

    with tempfile.NamedTemporaryFile(suffix=".mjb") as f:
        mujoco.mj_saveModel(model, f.name, None)
        return Path(f.name).stat().st_size


def _meshes_of(spec, bodies: set[str]) -> list[tuple[str, str]]:
    """(mesh, material) of the visual mesh geoms of `bodies` and their descendants."""
    import mujoco

    found = []

    def walk(body):
        for geom in body.geoms:
            if geom.type == mujoco.mjtGeom.mjGEOM_MESH and geom.group == VISUAL_GROUP:
                found.append((geom.meshname, geom.material))
        for child in body.bodies:
            walk(child)

    for name in sorted(bodies):
        walk(spec.body(name))
    return found


def _drop_unused_assets(spec) -> None:
    """Meshes, materials and textures no remaining geom reaches (the left-out objects')."""
    used_meshes, used_materials = set(), set()
    for geom in spec.geoms:
        if geom.meshname:
            used_meshes.add(geom.meshname)
        if geom.material:
            used_materials.add(geom.material)
    for mesh in list(spec.meshes):
        if mesh.name not in used_meshes:
            spec.delete(mesh)
    for material in list(spec.materials):
        if material.name not in used_materials:
            spec.delete(material)
    used_textures = {t for m in spec.materials for t in m.textures if t}
    for texture in list(spec.textures):
        if texture.file and texture.name not in used_textures:
            spec.delete(texture)


def _fill_faces(spec, model, meshes, places, target: int) -> int:
    """Add visual-only copies of `meshes` at `places` (round robin) until the drawn faces reach
    `target`; returns how many copies."""
    import mujoco

    faces = {model.mesh(i).name: int(model.mesh_facenum[i]) for i in range(model.nmesh)}
    have, copies = drawn_faces(model), 0
    # The target object, not the container: copies the size of the objects left out cover about
    # as many pixels as they did (fill is the other half of a frame's cost).
    mesh, material = min(meshes, key=lambda m: faces[m[0]])
    while target - have > faces[mesh] / 2:  # stop where one more copy would overshoot more
        place = np.asarray(places[copies % len(places)]) if places else np.zeros(3)
        geom = spec.worldbody.add_geom()
        geom.type = mujoco.mjtGeom.mjGEOM_MESH
        geom.meshname = mesh
        geom.material = material
        geom.group = VISUAL_GROUP
        geom.contype = geom.conaffinity = 0
        geom.pos = place + np.array([0.0, 0.0, 0.001 * (copies // max(len(places), 1))])
        have += faces[mesh]
        copies += 1
    return copies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the .mjb.xz to write (its .json beside it)")
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--task", type=int, default=0)
    args = parser.parse_args(argv)
    about = build(args.out, args.suite, args.task)
    print(json.dumps(about, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
