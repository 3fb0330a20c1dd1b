"""The openpi websocket wire format: msgpack with numpy arrays as tagged maps.

Byte-compatible with openpi-client's msgpack_numpy, so its clients talk to our server and our
client talks to servers built on it:
- an ndarray is a map {b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str,
  b"shape": shape}; a numpy scalar is {b"__npgeneric__": True, b"data": item, b"dtype": ...};
- object, void (structured) and complex dtypes are refused both ways (the format never falls
  back to pickle), and so is a decoded array whose data length is not shape x itemsize. A
  refused frame is a WireError naming the field (e.g. observation['images']['wrist']).

Session: the server sends one metadata frame; then each client frame is an observation dict and
each server frame the action dict (e.g. {"actions": (H, 7) array}). A server-side failure is a
text frame with the error, then close code 1011.

Bounded decoding: every frame from a peer is untrusted, so before msgpack builds anything its
structure is walked header by header (nothing is built) and refused when it exceeds `LIMITS`.
msgpack's own max_*_len options bound one container, not what nested ones expand to: an array
of a million empty maps is 1 byte each on the wire and about 100 bytes each as Python objects
(a 2.9 MiB frame became 184 MiB). The bounds, and what real frames need:
- objects: at most 65,536 msgpack objects per frame (every map, array, key and scalar counts
  one; an ndarray is one map of 4-5). A LIBERO observation (two 224x224 or 256x256 images,
  state, prompt) is about 40, a privileged oracle's a few hundred, an action reply about 15.
  At the bound a frame builds about 5 MiB of Python objects beside its data (measured: 65,535
  empty maps 4.5 MiB, 21,844 {"ab": {}} 5.3 MiB). Checked at each container's header against
  what the headers so far announce, so a refusal costs at most 65,536 headers' reading.
- depth: containers nest at most 32 levels (real frames nest under 10; deeper ones would blow
  the recursion of whoever walks them later, e.g. `metadata_digest`);
- strings: at most 16 MiB each (prompts and submitted configs are kilobytes); bin (image and
  array data): at most the frame; msgpack extension types: refused (neither format uses them);
- ndarrays: dtype kinds on an allow-list (bool, int, uint, float, bytes, str, datetime; vla-eval:
  bool, int, uint, float), dtype strings at most 32 characters, and data exactly shape x
  itemsize bytes, checked before an array is built (a view of the frame's bytes: no allocation
  a small frame could make large);
- images (vla-eval `__image__`): png or jpeg only, read lazily so the header's size is checked
  before any pixel is decoded: at most 4096 x 4096, and at most 64 MiB of decoded pixels per
  frame (a 70 KB PNG can claim 64 MiB; a frame of them could claim gigabytes). Decoding costs
  about three times the pixels at its peak (Pillow's, then numpy's copy): under 200 MiB.
A frame over a bound is a one-line WireError naming the bound; transports bound the frame size
itself (the server's --max-message-mb, the client's policies.<id>.max_reply_mb).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import math
import reprlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

INTERNAL_ERROR_CLOSE = 1011
MESSAGE_TOO_BIG_CLOSE = 1009
HEALTH_PATH = "/healthz"
# Both protocols are one reply per request, so a peer never has a second frame in flight: the
# websocket layer (either end) reads one frame ahead of the one being handled, then stops
# reading the socket until that one is taken (websockets' default, 16 frames of up to the
# size limit each, lets a peer that does not wait park 16 x 64 MiB per connection).
MAX_QUEUED_FRAMES = 0

_REFUSED_KINDS = {"O": "an object", "V": "a void or structured", "c": "a complex"}
# dtype kinds a peer may name (an allow-list: whatever numpy adds later is refused until listed).
OPENPI_KINDS = "biufSUMm"  # what openpi-client's msgpack_numpy round-trips
VLA_EVAL_KINDS = "biuf"  # vla-eval's numpy_codec allows these only
_KIND_NAMES = "bool, int, uint, float, bytes, str, datetime, timedelta"
MAX_DTYPE_CHARS = 32  # '<M8[ns]' is 7; a longer string is not worth numpy's parser
_repr = reprlib.Repr()  # keeps error messages one short line whatever a peer sends
_repr.maxstring, _repr.maxother, _repr.maxlist = 40, 40, 8
_short = _repr.repr


class WireError(ValueError):
    """A frame that is not valid openpi (or vla-eval) msgpack."""


class _FieldError(Exception):
    """One tagged map is bad; unpackb adds where it sits in the frame."""


@dataclass(frozen=True)
class WireLimits:
    """What one decoded frame may hold (module docstring: the bounds and why)."""

    max_objects: int = 2**16
    max_depth: int = 32
    max_str_bytes: int = 16 * 2**20
    max_image_side: int = 4096
    max_image_bytes: int = 64 * 2**20  # decoded pixels, all of a frame's images together


LIMITS = WireLimits()

# msgpack type bytes (the format's spec): which heads open a container, which an extension.
_ARRAY_HEADS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
_MAP_HEADS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
_EXT_HEADS = frozenset([0xC7, 0xC8, 0xC9, *range(0xD4, 0xD9)])
_STR_HEADS = frozenset([0xD9, 0xDA, 0xDB])  # str 8/16/32 (a fixstr is at most 31 bytes)
_SCAN_CHUNK = 2**20  # the walk reads the frame this much at a time (a big bin: all of it)


def _check_bounds(data: bytes | bytearray | memoryview, limits: WireLimits, what: str) -> None:
    """Refuse a frame whose structure exceeds `limits`, from its headers alone: containers are
    counted by the lengths their headers announce and scalars are skipped unbuilt, so what a
    refusal costs does not grow with what the frame claims. A truncated or malformed frame is
    left to msgpack's decode, which says what is wrong with it (and builds no more than the
    bounded part before it)."""
    problem = None
    with contextlib.suppress(IndexError, ValueError, msgpack.UnpackException):
        problem = _walk(data if isinstance(data, bytes) else bytes(data), limits)
    if problem:
        raise WireError(f"{what}: {problem}")


def _walk(frame: bytes, limits: WireLimits) -> str | None:
    """What in `frame` exceeds `limits`, if anything (module docstring: the bounds)."""
    size = max(len(frame), 1)
    # BytesIO shares a bytes object's memory; the unpacker copies one chunk at a time.
    unpacker = msgpack.Unpacker(
        io.BytesIO(frame), read_size=min(_SCAN_CHUNK, size), max_buffer_size=size
    )
    pending = [1]  # objects still to read at each open level; the frame itself is one
    announced = 1  # objects the headers read so far announce, read or not
    while pending:
        if not pending[-1]:
            pending.pop()
            continue
        pending[-1] -= 1
        head = frame[unpacker.tell()]
        if head in _ARRAY_HEADS:
            count = unpacker.read_array_header()
        elif head in _MAP_HEADS:
            count = 2 * unpacker.read_map_header()
        elif head in _EXT_HEADS:
            return (
                f"holds a msgpack extension type (byte 0x{head:02x} at offset "
                f"{unpacker.tell()}), which neither openpi nor vla-eval frames use"
            )
        else:
            where = unpacker.tell()
            unpacker.skip()
            if head in _STR_HEADS and unpacker.tell() - where > limits.max_str_bytes:
                return (
                    f"holds a string of {unpacker.tell() - where} bytes at offset {where}, over "
                    f"the wire format's {limits.max_str_bytes // 2**20} MiB (prompts are short)"
                )
            continue
        if len(pending) > limits.max_depth:
            return (
                f"nests deeper than {limits.max_depth} levels (real frames nest under 10); "
                "send a flatter message"
            )
        announced += count
        if announced > limits.max_objects:
            return (
                f"holds more than {limits.max_objects} msgpack objects (real frames hold under "
                "a thousand); send numeric data as numpy arrays, not lists"
            )
        pending.append(count)
    return None


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in _REFUSED_KINDS:
        raise WireError(f"numpy dtype {obj.dtype} cannot be sent (object/void/complex)")
    if isinstance(obj, np.ndarray):
        # A C-contiguous numeric array goes as a view of its memory, which msgpack copies once
        # into the frame (tobytes() would copy it twice); the bytes are the same either way.
        numeric = obj.dtype.kind in "biuf" and obj.flags.c_contiguous
        return {
            b"__ndarray__": True,
            b"data": obj.data if numeric else obj.tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": obj.shape,
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__} in a policy message")


@functools.lru_cache(maxsize=256)
def _parse_dtype(spec: str) -> np.dtype:
    return np.dtype(spec)


def _dtype(spec: Any, kinds: str = OPENPI_KINDS) -> np.dtype:
    """The dtype a peer named, if its kind is on the allow-list `kinds`."""
    if not isinstance(spec, str):
        raise _FieldError(f"dtype is {_short(spec)}, not a numpy dtype string")
    if len(spec) > MAX_DTYPE_CHARS:
        raise _FieldError(
            f"dtype {_short(spec)} is {len(spec)} characters, over the wire format's "
            f"{MAX_DTYPE_CHARS}; send a plain dtype such as '<f4'"
        )
    try:
        dtype = _parse_dtype(spec)
    except Exception:  # numpy raises TypeError, ValueError or SyntaxError for odd strings
        raise _FieldError(f"dtype {_short(spec)} is not a numpy dtype") from None
    if dtype.kind not in kinds:
        what = _REFUSED_KINDS.get(dtype.kind, f"a {dtype.kind!r}-kind")
        allowed = _KIND_NAMES if kinds == OPENPI_KINDS else kinds
        raise _FieldError(
            f"dtype {_short(spec)} is {what} dtype, which the wire format refuses "
            f"(allowed kinds: {allowed})"
        )
    if dtype.itemsize == 0:
        raise _FieldError(f"dtype {_short(spec)} has no item size")
    return dtype


def _shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise _FieldError(f"shape {_short(shape)} is not a list of non-negative ints")
    return tuple(shape)


def _ndarray(data: Any, spec: Any, shape: Any, kinds: str = OPENPI_KINDS) -> np.ndarray:
    """A read-only array over `data`, after checking it is exactly what dtype and shape say."""
    dtype, dims = _dtype(spec, kinds), _shape(shape)
    if not isinstance(data, bytes):
        raise _FieldError(f"data is {type(data).__name__}, not bytes")
    need = math.prod(dims) * dtype.itemsize
    if len(data) != need:
        raise _FieldError(
            f"data is {len(data)} bytes but shape {list(dims)} x itemsize {dtype.itemsize} "
            f"({dtype.str}) needs {need}"
        )
    try:
        return np.ndarray(buffer=data, dtype=dtype, shape=dims)
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. more than 64 dimensions
        raise _FieldError(f"shape {_short(shape)}: {exc}") from None


def _npgeneric(data: Any, spec: Any) -> np.generic:
    dtype = _dtype(spec)
    if not isinstance(data, bool | int | float | str | bytes):
        raise _FieldError(f"numpy scalar data is {type(data).__name__}, not a scalar")
    try:
        return dtype.type(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _FieldError(f"numpy scalar {_short(data)} is not a {dtype}: {exc}") from None


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        try:
            return _ndarray(obj[b"data"], obj[b"dtype"], obj[b"shape"])
        except KeyError as exc:
            raise _FieldError(f"ndarray map has no {exc}") from None
    if b"__npgeneric__" in obj:
        try:
            return _npgeneric(obj[b"data"], obj[b"dtype"])
        except KeyError as exc:
            raise _FieldError(f"numpy scalar map has no {exc}") from None
    return obj


def _key(key: Any) -> str:
    # short: a peer's key can be megabytes, and an error names the key it sits under
    return _short(key.decode("utf-8", "replace") if isinstance(key, bytes) else key)


def _bad_field(node: Any, hook: Callable[[dict], Any], path: str) -> str | None:
    """Where in an undecoded frame the first map `hook` refuses sits (innermost first, as the
    unpacker visits them): `what['images']['wrist']`."""
    if isinstance(node, dict):
        for key, value in node.items():
            found = _bad_field(value, hook, f"{path}[{_key(key)}]")
            if found is not None:
                return found
        try:
            hook(node)
        except _FieldError:
            return path
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = _bad_field(value, hook, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _unpack(
    data: Any,
    hook: Callable[[], Callable[[dict], Any]],
    what: str,
    protocol: str,
    limits: WireLimits,
    **kw: Any,
) -> Any:
    """Decode one frame within `limits`; `hook()` makes a fresh object hook (one per decode:
    a hook may keep a budget across the frame's maps)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        kind = "text" if isinstance(data, str) else type(data).__name__
        raise WireError(f"{what}: got a {kind} frame, not a binary msgpack frame")
    _check_bounds(data, limits, what)
    bounds = {
        "max_str_len": limits.max_str_bytes,
        "max_array_len": limits.max_objects,
        "max_map_len": limits.max_objects,
        "max_ext_len": 0,
        **kw,
    }
    try:
        return msgpack.unpackb(data, object_hook=hook(), **bounds)
    except _FieldError as exc:
        # The object hook sees a map before the key it sits under; decode again without it
        # (only on this error path) to say which field was refused.
        try:
            where = _bad_field(msgpack.unpackb(data, **bounds), hook(), what) or what
        except (ValueError, TypeError, RecursionError, msgpack.UnpackException):
            where = what
        raise WireError(f"{where}: {exc}") from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise WireError(f"{what}: not {protocol} frame ({len(data)} bytes): {exc}") from None


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_encode)


def packer() -> msgpack.Packer:
    """A reusable encoder, `packer().pack(obj) == packb(obj)`, for a connection's hot path: it
    keeps its buffer between messages, where packb allocates a fresh one per call (for a 300 KB
    observation that fresh memory's page faults cost more than the encoding). Not thread-safe:
    one per connection, as openpi-client does."""
    return msgpack.Packer(default=_encode)


def unpackb(data: bytes, what: str = "frame", limits: WireLimits = LIMITS) -> Any:
    """Decode one openpi frame within `limits`; `what` names it in errors (observation,
    action, metadata)."""
    return _unpack(data, lambda: _decode, what, "an openpi msgpack", limits)


# -- vla-eval (vla-evaluation-harness) messages --------------------------------------------------
# Every frame is msgpack {type, payload, seq, timestamp}; arrays are {"__ndarray__": True, data,
# dtype, shape} with str keys; HWC uint8 images travel PNG-encoded as {"__image__": True,
# "format": "png", data, shape}. Protocol version 1.
VLA_PROTOCOL_VERSION = 1
VLA_TYPES = ("hello", "observation", "action", "episode_start", "episode_end", "error")


def _encode_vla(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.ndim == 3 and obj.dtype == np.uint8 and obj.shape[2] in (1, 3, 4):
            return {"__image__": True, "format": "png", "data": _png(obj), "shape": list(obj.shape)}
        if obj.dtype.kind not in "biuf":
            raise WireError(f"numpy dtype {obj.dtype} cannot be sent to a vla-eval server")
        return {
            "__ndarray__": True,
            "data": np.ascontiguousarray(obj).tobytes(),
            "dtype": obj.dtype.str,
            "shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} in a vla-eval message")


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(buffer, format="PNG")
    return buffer.getvalue()


# vla-eval's `format`: the Pillow plugin that may read it (no other: Pillow opens dozens).
_IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG"}


class _ImageBudget:
    """The decoded pixels a frame's images may still take (WireLimits.max_image_bytes)."""

    def __init__(self, limits: WireLimits):
        self.limits, self.left = limits, limits.max_image_bytes

    def open(self, data: bytes, fmt: str):
        """A Pillow image of `data`, its size checked from the header (nothing is decoded yet)
        against the per-image and the per-frame bound."""
        from PIL import Image, ImageMode

        side = self.limits.max_image_side
        try:
            with warnings.catch_warnings():
                # Pillow's own bomb guard warns from ~89 M pixels: past our bound either way.
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data), formats=[_IMAGE_FORMATS[fmt]])
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise _FieldError(
                f"{fmt} image claims over {side}x{side} pixels, the wire format's bound "
                "(observations are 224-256 px): send it smaller"
            ) from None
        except Exception as exc:  # PIL raises many types for bad bytes; all mean "not an image"
            raise _FieldError(f"{fmt!r} image does not decode ({type(exc).__name__})") from None
        width, height = image.size
        if width > side or height > side:
            raise _FieldError(
                f"{fmt} image claims {width}x{height} pixels, over the wire format's bound of "
                f"{side}x{side} (observations are 224-256 px): send it smaller"
            )
        mode = ImageMode.getmode(image.mode)
        need = width * height * len(mode.bands) * np.dtype(mode.typestr).itemsize
        if need > self.left:
            raise _FieldError(
                f"{fmt} image of {width}x{height} {image.mode} would take the frame's decoded "
                f"images over {self.limits.max_image_bytes // 2**20} MiB: send fewer or "
                "smaller images"
            )
        self.left -= need
        return image


def _compressed_image(obj: dict, budget: _ImageBudget) -> np.ndarray:
    data, fmt = obj.get("data"), obj.get("format")
    if fmt not in _IMAGE_FORMATS:
        raise _FieldError(f"image format {_short(fmt)} is not png, jpeg or raw")
    if not isinstance(data, bytes):
        raise _FieldError(f"{_short(fmt)} image data is {type(data).__name__}, not bytes")
    image = budget.open(data, fmt)
    try:
        image = np.asarray(image)
    except Exception as exc:  # a header that reads but pixels that do not
        raise _FieldError(f"{_short(fmt)} image does not decode ({type(exc).__name__})") from None
    if "shape" not in obj:  # vla-eval's own decoder ignores the shape
        return image
    dims = _shape(obj["shape"])
    if image.size != math.prod(dims):
        raise _FieldError(f"image decodes to {list(image.shape)}, not shape {list(dims)}")
    return image.reshape(dims)


def _decode_vla(budget: _ImageBudget, obj: dict) -> Any:
    if obj.get("__image__"):
        if obj.get("format") == "raw":
            array = _ndarray(obj.get("data"), obj.get("dtype"), obj.get("shape"), VLA_EVAL_KINDS)
            return array.copy()
        return _compressed_image(obj, budget)
    if obj.get("__ndarray__"):
        return _ndarray(obj.get("data"), obj.get("dtype"), obj.get("shape"), VLA_EVAL_KINDS).copy()
    return obj


def pack_vla(kind: str, payload: dict, seq: int, timestamp: float) -> bytes:
    message = {"type": kind, "payload": payload, "seq": seq, "timestamp": timestamp}
    return msgpack.packb(message, default=_encode_vla, use_bin_type=True)


def unpack_vla(data: bytes, limits: WireLimits = LIMITS) -> dict:
    """Decode one vla-eval message within `limits`."""

    def hook() -> Callable[[dict], Any]:
        return functools.partial(_decode_vla, _ImageBudget(limits))

    message = _unpack(data, hook, "message", "a vla-eval", limits, raw=False)
    if not isinstance(message, dict) or message.get("type") not in VLA_TYPES:
        raise WireError(f"not a vla-eval message: {_short(message)}")
    return message


# -- identity --------------------------------------------------------------------------------
def _canonical(obj: Any) -> Any:
    """JSON-able, order-free: keys as strings; an array as its dtype, shape and sha256 (a
    server's normalisation statistics can be large); bytes as their sha256."""
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    if isinstance(obj, np.ndarray):
        data = np.ascontiguousarray(obj).tobytes()
        return {"ndarray": obj.dtype.str, "shape": list(obj.shape), "sha256": _sha(data)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytes | bytearray | memoryview):
        return {"bytes_sha256": _sha(bytes(obj))}
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    return obj


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def metadata_digest(metadata: Any) -> str:
    """sha256 (hex) of a server's handshake (openpi's metadata frame, vla-eval's HELLO reply) as
    canonical JSON (sorted keys, no whitespace): the policy's identity as its server states it.
    Equal for equal metadata whatever the key order or the process; any changed value (another
    checkpoint's name, other normalisation statistics) changes it."""
    text = json.dumps(
        _canonical(metadata), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return _sha(text.encode())
