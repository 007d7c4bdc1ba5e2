"""The only format in which values leave a sandbox: JSON with a few tagged types.

The judge never unpickles anything a submission produced (unpickling runs code).
Plain values, ranges, paths, NumPy arrays and tensors travel as data; anything else stays
in the sandbox and travels as a numbered reference (``{"$ref": n}``) that the judge
turns into a proxy. Decoding rebuilds only the types listed here.
"""

from __future__ import annotations

import base64
import json
import math
import pathlib
from typing import Any, Callable

import numpy as np
import torch

MAX_DEPTH = 64
# What the judge will decode from a sandbox: a reply with more values than this, or nested deeper, is
# refused before it is built (32 MiB of "[]," would otherwise become 1.5 GiB of lists in the judge).
MAX_ITEMS = 2_000_000


def encode(value: Any, reference: Callable[[Any], dict]) -> Any:
    """A JSON-ready form of ``value``; ``reference(obj)`` stands in for what has no data form."""
    def enc(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            return reference(v)
        if v is None or isinstance(v, (bool, str)):
            return v
        if type(v) is int:
            return v
        if type(v) is float:
            return v if math.isfinite(v) else {"$float": repr(v)}
        if isinstance(v, (np.generic, np.ndarray)) and np.asarray(v).dtype.kind in "biufc":
            array = np.ascontiguousarray(v).reshape(np.shape(v))   # ascontiguousarray makes a scalar 1-d
            return {"$ndarray": {"dtype": array.dtype.str, "shape": list(array.shape), "scalar": isinstance(v, np.generic),
                                 "data": base64.b64encode(array.tobytes()).decode()}}
        if isinstance(v, torch.Tensor) and type(v) in (torch.Tensor, torch.nn.Parameter) and v.layout == torch.strided:
            t = v.detach().cpu().contiguous()
            return {"$tensor": {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                                "parameter": isinstance(v, torch.nn.Parameter),
                                "data": base64.b64encode(t.view(-1).view(torch.uint8).numpy().tobytes()).decode()}}
        if type(v) is range:
            return {"$range": [v.start, v.stop, v.step]}
        if type(v) is list:
            return [enc(x, depth + 1) for x in v]
        if type(v) is tuple:
            return {"$tuple": [enc(x, depth + 1) for x in v]}
        if type(v) in (set, frozenset):
            return {"$set": [enc(x, depth + 1) for x in v], "frozen": type(v) is frozenset}
        if isinstance(v, dict) and type(v).__module__ in ("builtins", "collections"):
            return {"$dict": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        if type(v) is bytes:
            return {"$bytes": base64.b64encode(v).decode()}
        if type(v) in (pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, pathlib.PureWindowsPath):
            return {"$path": str(v)}
        return reference(v)

    return enc(value, 0)


def decode(data: Any, dereference: Callable[[dict], Any]) -> Any:
    """The value ``encode`` described, built from data only; ``dereference`` makes proxies."""
    def dec(d: Any, depth: int = 0) -> Any:
        if d is None or isinstance(d, (bool, int, float, str)):
            return d
        if depth > MAX_DEPTH + 2:
            raise ValueError(f"a value nested more than {MAX_DEPTH} deep")
        depth += 1
        if isinstance(d, list):
            return [dec(x, depth) for x in d]
        if not isinstance(d, dict) or len(d) == 0:
            raise ValueError(f"not a wire value: {d!r:.80}")
        if "$float" in d:
            return float(d["$float"])
        if "$ndarray" in d:
            spec = d["$ndarray"]
            dtype = np.dtype(spec["dtype"])
            if dtype.kind not in "biufc":
                raise ValueError(f"refused array dtype {dtype}")
            array = np.frombuffer(base64.b64decode(spec["data"]), dtype=dtype).reshape(_shape(spec["shape"])).copy()
            return array[()] if spec.get("scalar") else array
        if "$tensor" in d:
            spec = d["$tensor"]
            dtype = getattr(torch, spec["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"refused tensor dtype {spec['dtype']}")
            raw = bytearray(base64.b64decode(spec["data"]))
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            tensor = flat.view(dtype).reshape(_shape(spec["shape"])).clone()
            return torch.nn.Parameter(tensor, requires_grad=tensor.is_floating_point()) if spec.get("parameter") else tensor
        if "$range" in d:
            r = range(*(int(x) for x in d["$range"]))
            if len(r) > MAX_ITEMS:   # a check may well list it
                raise ValueError(f"a range of {len(r)} values")
            return r
        if "$tuple" in d:
            return tuple(dec(x, depth) for x in d["$tuple"])
        if "$set" in d:
            items = [dec(x, depth) for x in d["$set"]]
            return frozenset(items) if d.get("frozen") else set(items)
        if "$dict" in d:
            return {dec(k, depth): dec(v, depth) for k, v in d["$dict"]}
        if "$bytes" in d:
            return base64.b64decode(d["$bytes"])
        if "$path" in d and isinstance(d["$path"], str):
            return pathlib.Path(d["$path"])
        if "$ref" in d:
            return dereference(d)
        raise ValueError(f"not a wire value: {d!r:.80}")

    return dec(data)


def _shape(shape) -> list[int]:
    if not (isinstance(shape, list) and len(shape) <= 64 and all(type(n) is int and 0 <= n for n in shape)):
        raise ValueError(f"not a shape: {shape!r:.80}")
    return shape


def dumps(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def loads(blob: bytes) -> Any:
    """Parse a reply, after a count that bounds what it can build: every value but the first follows a
    comma or opens a list or object, so these three bytes bound the number of values (strings hold
    base64 and messages, in which they are rare)."""
    if blob.count(b",") + blob.count(b"[") + blob.count(b"{") > MAX_ITEMS:
        raise ValueError(f"a reply of more than {MAX_ITEMS} values")
    return json.loads(blob)
