"""The skill registry: how a typed robot skill is registered (`@skill`) and described.

A skill is a function `fn(ctx, **inputs) -> OutputModel`. Its inputs are read from the
signature (annotations and defaults) and its outputs from the return annotation, a pydantic
model, so a workflow can be type-checked before anything runs and the catalogue can be handed
to an LLM as a tool list. Workflows can only name registered skills: a workflow file carries
no code.

The mechanism only, below every skill module (built-in or a user's package, which import
`skill` and `SkillFailure` from here). Which skills there are, and looking one up by name, is
catalogue.py's: it loads the built-in modules and the installed packages first.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, create_model

from pytest_gap.errors import GapError


class SkillFailure(GapError, RuntimeError):
    """A skill ran but could not do its job (object not found, grasp missed, unreachable).

    Workflows route on it through a node's `on_error` edge; it is not an infrastructure error.
    """


@dataclass(frozen=True)
class SkillSpec:
    name: str
    doc: str
    fn: Any
    inputs: type[BaseModel]
    outputs: type[BaseModel]
    # It queries the env's scene (poses, boxes, gripper, cameras): it cannot run on a backend
    # whose envs have none (`Env.scene is None`).
    scene: bool = True
    # It readies the arm and perceives nothing (policy_only's bring-up): as a workflow's first
    # node, its steps are not charged to the episode's budget (workflow/executor.py).
    bring_up: bool = False

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    @property
    def failures(self) -> list[str]:
        """The docstring's sentences on when the skill fails (raises SkillFailure): what a
        graph's `on_error` edge will be taken for."""
        text = " ".join(line.strip() for line in self.doc.strip().splitlines())
        sentences = re.split(r"(?<=[.;])\s+(?=[A-Z\"(])", text)
        return [s for s in sentences if re.search(r"\bfail", s, re.IGNORECASE)]

    def describe(self) -> dict[str, Any]:
        """The catalogue entry: name, one-line doc, the whole doc, when it fails, JSON schemas
        of inputs and outputs."""
        return {
            "name": self.name,
            "description": self.summary,
            "details": " ".join(line.strip() for line in self.doc.strip().splitlines()),
            "failures": self.failures,
            "inputs": self.inputs.model_json_schema(),
            "outputs": self.outputs.model_json_schema(),
        }


_SKILLS: dict[str, SkillSpec] = {}


def skill(fn=None, *, scene: bool = True, bring_up: bool = False):
    """Register `fn` as a skill under its function name (`@skill`, or `@skill(scene=False)` for
    one that needs no scene queries: it runs on every backend; `bring_up=True` for one that
    readies the arm without perceiving anything, see SkillSpec.bring_up)."""
    if fn is None:
        return lambda f: skill(f, scene=scene, bring_up=bring_up)
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1:]  # after ctx
    fields = {
        p.name: (hints[p.name], ... if p.default is inspect.Parameter.empty else p.default)
        for p in params
    }
    inputs = create_model(f"{fn.__name__}_inputs", __config__=ConfigDict(extra="forbid"), **fields)
    outputs = hints.get("return")
    if not (isinstance(outputs, type) and issubclass(outputs, BaseModel)):
        raise TypeError(f"skill {fn.__name__} must return a pydantic model")
    known = _SKILLS.get(fn.__name__)
    # The same function defined again (its module imported anew, as a reload or an in-process
    # pytest session that restores sys.modules does) replaces itself; another function under a
    # taken name is an error.
    if known is not None and _where(known.fn) != _where(fn):
        raise ValueError(
            f"skill {fn.__name__} registered twice ({_where(known.fn)} and {_where(fn)}); "
            "give one of them another name"
        )
    _SKILLS[fn.__name__] = SkillSpec(
        fn.__name__, fn.__doc__ or "", fn, inputs, outputs, scene, bring_up
    )
    return fn


def _where(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def registered(name: str) -> SkillSpec | None:
    """The skill registered under `name` so far (catalogue.get_skill loads them all first)."""
    return _SKILLS.get(name)


def registered_names() -> list[str]:
    """The names registered so far, sorted (catalogue.skill_names loads them all first)."""
    return sorted(_SKILLS)


# -- types, for checking a workflow's data bindings --------------------------------------------
def type_key(annotation: Any) -> tuple:
    """A comparable description of a field type: ('float',), ('list', ('str',)), ('model', N)."""
    if annotation is Any:
        return ("any",)
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return type_key(args[0]) if len(args) == 1 else ("any",)
    if origin is Literal:
        kinds = {type(a) for a in get_args(annotation)}
        return type_key(kinds.pop()) if len(kinds) == 1 else ("any",)
    if origin in (list, tuple):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        inner = {type_key(a) for a in args}
        return ("list", inner.pop() if len(inner) == 1 else ("any",))
    if origin is dict:
        return ("dict",)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return ("model", annotation.__name__)
    if annotation in (bool, int, float, str):
        return (annotation.__name__,)
    return ("any",)


def type_label(key: tuple) -> str:
    if key[0] == "list":
        return f"list of {type_label(key[1])}"
    return key[-1] if key[0] == "model" else key[0]


def compatible(source: tuple, target: tuple) -> bool:
    if "any" in (source[0], target[0]) or source == target:
        return True
    if source == ("int",) and target == ("float",):
        return True
    if source[0] == target[0] == "list":
        return compatible(source[1], target[1])
    return False
