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
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import reprlib
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

INTERNAL_ERROR_CLOSE = 1011
MESSAGE_TOO_BIG_CLOSE = 1009
HEALTH_PATH = "/healthz"

_REFUSED_KINDS = {"O": "an object", "V": "a void or structured", "c": "a complex"}
_repr = reprlib.Repr()  # keeps error messages one short line whatever a peer sends
_repr.maxstring, _repr.maxother, _repr.maxlist = 40, 40, 8
_short = _repr.repr


class WireError(ValueError):
    """A frame that is not valid openpi (or vla-eval) msgpack."""


class _FieldError(Exception):
    """One tagged map is bad; unpackb adds where it sits in the frame."""


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


def _dtype(spec: Any, kinds: str | None = None) -> np.dtype:
    """The dtype a peer named, if the wire format allows it (`kinds`: the only ones allowed)."""
    if not isinstance(spec, str):
        raise _FieldError(f"dtype is {_short(spec)}, not a numpy dtype string")
    try:
        dtype = _parse_dtype(spec)
    except Exception:  # numpy raises TypeError, ValueError or SyntaxError for odd strings
        raise _FieldError(f"dtype {_short(spec)} is not a numpy dtype") from None
    if dtype.kind in _REFUSED_KINDS or (kinds is not None and dtype.kind not in kinds):
        what = _REFUSED_KINDS.get(dtype.kind, f"a {dtype.kind!r}-kind")
        raise _FieldError(
            f"dtype {_short(spec)} is {what} dtype, which the wire format refuses "
            f"(allowed kinds: {kinds or 'bool, int, uint, float, str, bytes, datetime'})"
        )
    if dtype.itemsize == 0:
        raise _FieldError(f"dtype {_short(spec)} has no item size")
    return dtype


def _shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise _FieldError(f"shape {_short(shape)} is not a list of non-negative ints")
    return tuple(shape)


def _ndarray(data: Any, spec: Any, shape: Any, kinds: str | None = None) -> np.ndarray:
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
    return repr(key.decode("utf-8", "replace") if isinstance(key, bytes) else key)


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


def _unpack(data: Any, hook: Callable[[dict], Any], what: str, protocol: str, **kw: Any) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        kind = "text" if isinstance(data, str) else type(data).__name__
        raise WireError(f"{what}: got a {kind} frame, not a binary msgpack frame")
    try:
        return msgpack.unpackb(data, object_hook=hook, **kw)
    except _FieldError as exc:
        # The object hook sees a map before the key it sits under; decode again without it
        # (only on this error path) to say which field was refused.
        try:
            where = _bad_field(msgpack.unpackb(data, **kw), hook, what) or what
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


def unpackb(data: bytes, what: str = "frame") -> Any:
    """Decode one openpi frame; `what` names it in errors (observation, action, metadata)."""
    return _unpack(data, _decode, what, "an openpi msgpack")


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


def _compressed_image(obj: dict) -> np.ndarray:
    from PIL import Image

    data, fmt = obj.get("data"), obj.get("format")
    if not isinstance(data, bytes):
        raise _FieldError(f"{_short(fmt)} image data is {type(data).__name__}, not bytes")
    try:
        image = np.asarray(Image.open(io.BytesIO(data)))
    except Exception as exc:  # PIL raises many types for bad bytes; all mean "not an image"
        raise _FieldError(f"{_short(fmt)} image does not decode ({type(exc).__name__})") from None
    if "shape" not in obj:  # vla-eval's own decoder ignores the shape
        return image
    dims = _shape(obj["shape"])
    if image.size != math.prod(dims):
        raise _FieldError(f"image decodes to {list(image.shape)}, not shape {list(dims)}")
    return image.reshape(dims)


def _decode_vla(obj: dict) -> Any:
    if obj.get("__image__"):
        if obj.get("format") == "raw":
            return _ndarray(obj.get("data"), obj.get("dtype"), obj.get("shape"), "biuf").copy()
        return _compressed_image(obj)
    if obj.get("__ndarray__"):
        return _ndarray(obj.get("data"), obj.get("dtype"), obj.get("shape"), "biuf").copy()
    return obj


def pack_vla(kind: str, payload: dict, seq: int, timestamp: float) -> bytes:
    message = {"type": kind, "payload": payload, "seq": seq, "timestamp": timestamp}
    return msgpack.packb(message, default=_encode_vla, use_bin_type=True)


def unpack_vla(data: bytes) -> dict:
    message = _unpack(data, _decode_vla, "message", "a vla-eval", raw=False)
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
