"""The openpi websocket wire format: msgpack with numpy arrays as tagged maps.

Byte-compatible with openpi-client's msgpack_numpy, so its clients talk to our server and our
client talks to servers built on it:
- an ndarray is a map {b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str,
  b"shape": shape}; a numpy scalar is {b"__npgeneric__": True, b"data": item, b"dtype": ...};
- object, void and complex dtypes are refused (the format never falls back to pickle).

Session: the server sends one metadata frame; then each client frame is an observation dict and
each server frame the action dict (e.g. {"actions": (H, 7) array}). A server-side failure is a
text frame with the traceback, then close code 1011.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

INTERNAL_ERROR_CLOSE = 1011
HEALTH_PATH = "/healthz"


class WireError(ValueError):
    """A frame that is not valid openpi msgpack-numpy."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in ("V", "O", "c"):
        raise WireError(f"numpy dtype {obj.dtype} cannot be sent (object/void/complex)")
    if isinstance(obj, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": np.ascontiguousarray(obj).tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": obj.shape,
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__} in a policy message")


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return np.ndarray(
            buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=tuple(obj[b"shape"])
        )
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_encode)


def unpackb(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, object_hook=_decode)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise WireError(f"not an openpi msgpack frame ({len(data)} bytes): {exc}") from None
