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
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(buffer, format="PNG")
    return buffer.getvalue()


def _decode_vla(obj: dict) -> Any:
    if obj.get("__image__"):
        import io

        from PIL import Image

        if obj.get("format") == "raw":
            raw = np.frombuffer(obj["data"], dtype=np.dtype(obj["dtype"]))
            return raw.reshape(obj["shape"]).copy()
        image = np.asarray(Image.open(io.BytesIO(obj["data"])))
        return image.reshape(obj["shape"])
    if obj.get("__ndarray__"):
        dtype = np.dtype(obj["dtype"])
        if dtype.kind not in "biuf":
            raise WireError(f"vla-eval array of dtype {dtype} refused")
        return np.frombuffer(obj["data"], dtype=dtype).reshape(obj["shape"]).copy()
    return obj


def pack_vla(kind: str, payload: dict, seq: int, timestamp: float) -> bytes:
    message = {"type": kind, "payload": payload, "seq": seq, "timestamp": timestamp}
    return msgpack.packb(message, default=_encode_vla, use_bin_type=True)


def unpack_vla(data: bytes) -> dict:
    try:
        message = msgpack.unpackb(data, object_hook=_decode_vla, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise WireError(f"not a vla-eval frame ({len(data)} bytes): {exc}") from None
    if not isinstance(message, dict) or message.get("type") not in VLA_TYPES:
        raise WireError(f"not a vla-eval message: {str(message)[:200]}")
    return message
