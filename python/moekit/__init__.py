"""moekit from Python: the Mixture-of-Experts layer of LLM inference.

    import moekit
    spec = moekit.Spec.from_preset("qwen3-30b-a3b", act_dtype="fp16", weights={"format": "fp16"})
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, seed=1), max_tokens=64)
    out = layer(hidden, router_logits)  # hidden [T, H] fp16, router_logits [T, E] fp32

Tensors are any DLPack producer (numpy, torch, cupy, jax). The forward reads and writes them where
they are, without a copy; the output comes back in the input's framework and on its device (or
in `out=`). Errors are moekit.Error subclasses carrying the ErrorCode's name (`.code`).

The weights dict (MoeLayer's `weights`, Weights.from_tensors) holds the FULL layer, in the layout
of moekit's own checkpoint family ("moekit"), host tensors, C-contiguous:

    fc1.values   [E, fc1_rows, H]  gate and up fused (spec's gate_up_layout); fc1_rows = 2I gated
    fc2.values   [E, H, I]         in the format's dtype (bf16, fp16, fp32, float8_e4m3fn, int8),
                                   or uint8 packed bytes (4-bit formats: [E, rows, cols / 2])
    fc1.scales / fc2.scales        the format's scales (fp32; uint8 e8m0 for mxfp4 / mxfp8;
                                   e4m3 bytes for nvfp4): [E, ceil(rows/128), ceil(cols/128)] for
                                   fp8_block128, [E, rows, cols / group] otherwise
    fc1.zeros / fc2.zeros          uint8 [E, rows, cols / group] (int formats with zero points)
    fcN.weight_scale, fcN.input_scale  fp32 [E] (fp8 per tensor; no input_scale with
                                       dynamic_activations); fcN.global_scale fp32 [E] (nvfp4)
    fcN.pre_quant_scale            fp32 [E, cols] (int formats with an AWQ scale)
    fc1_bias [E, fc1_rows], fc2_bias [E, H], routing_bias [E]  fp32, where the spec has them

(include/moekit/types.hpp documents every format's packing). Weights.tensors() returns this dict.
For a TP/EP spec the layer keeps its rank's shard.
"""

from __future__ import annotations

import json
import math
import numbers
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from . import _moekit as _native
from ._errors import (
    BadFileError,
    CommError,
    CudaError,
    Error,
    FileAccessError,
    FormatMismatchError,
    InternalError,
    InvalidArgumentError,
    InvalidSpecError,
    NotFoundError,
    UnsupportedError,
)

__version__: str = _native.version()

__all__ = [
    "BadFileError", "Candidate", "CommError", "CudaError", "Degradation", "Error",
    "FileAccessError", "FormatMismatchError", "InternalError", "InvalidArgumentError",
    "InvalidSpecError", "MoeLayer", "NotFoundError", "Preset", "Rejection", "Resolution", "Spec",
    "UnsupportedError", "Weights", "environment", "load_weights", "model_families", "presets",
    "resolve", "load_tensors", "save_tensors",
]

# ---- Spec ----------------------------------------------------------------------------------------

_FLOAT_WORDS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _floats_out(value: Any) -> Any:
    """JSON has no inf / nan: the spec writes them as strings; Python gets floats back."""
    if isinstance(value, dict):
        return {k: _floats_out(v) for k, v in value.items()}
    if isinstance(value, str) and value in _FLOAT_WORDS:
        return _FLOAT_WORDS[value]
    return value


def _floats_in(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _floats_in(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _json_value(value: Any) -> Any:
    """Numbers of other libraries (numpy.int64, numpy.float32) as JSON numbers."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _floats_in(float(value))
    raise InvalidArgumentError(f"spec value {value!r} ({type(value).__name__}) is not a number, "
                               "string, bool or dict")


def _native_spec(fields: Mapping[str, Any]) -> Any:
    text = json.dumps(_floats_in(fields), default=_json_value, allow_nan=False)
    return _native.NativeSpec.from_json(text)


def _merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """base with overrides; a nested dict (weights, activation, routing) merges key by key."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


class Spec:
    """One MoE layer's description: every field of moekit::MoeSpec, as its JSON names them.

    Top level: num_experts, top_k, hidden, intermediate, act_dtype ("bf16", "fp16", "fp32"),
    gate_up_layout ("halves", "interleaved"), fc1_bias, fc2_bias, max_tokens, tp_size, tp_rank,
    ep_size, ep_rank; nested dicts weights {format, group_size, zero_points, pre_quant_scale,
    dynamic_activations}, activation {kind, limit, alpha, beta} and routing {method, n_group,
    topk_group, routed_scaling_factor, correction_bias, renormalize, weight_placement}. Keys
    left out keep MoeSpec's defaults; an unknown key or a value of the wrong type is
    InvalidArgumentError.
    Immutable: replace() makes a changed copy. Fields read as attributes (spec.top_k,
    spec.routing["method"]).
    """

    __slots__ = ("_native", "_fields", "_family")

    def __init__(self, **fields: Any) -> None:
        self._set(_native_spec(fields), None)

    def _set(self, native: Any, family: Optional[str]) -> None:
        object.__setattr__(self, "_native", native)
        object.__setattr__(self, "_fields", _floats_out(json.loads(native.to_json())))
        object.__setattr__(self, "_family", family)

    @classmethod
    def _wrap(cls, native: Any, family: Optional[str] = None) -> "Spec":
        spec = cls.__new__(cls)
        spec._set(native, family)
        return spec

    @classmethod
    def from_json(cls, text: str) -> "Spec":
        """The JSON `moekit resolve --json` prints under "spec" (and `--spec FILE` reads)."""
        return cls._wrap(_native.NativeSpec.from_json(text))

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> "Spec":
        return cls(**fields)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "Spec":
        """A built-in layer shape (presets()), with fields changed; nested dicts merge."""
        preset = _native.preset(name)
        base = json.loads(preset[3])
        return cls._wrap(_native_spec(_merged(base, _floats_in(overrides))), preset[2])

    def replace(self, **overrides: Any) -> "Spec":
        """A copy with fields changed (nested dicts merge key by key)."""
        merged = _merged(_floats_in(self._fields), _floats_in(overrides))
        return Spec._wrap(_native_spec(merged), self._family)

    def to_json(self) -> str:
        return self._native.to_json()

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._fields))  # a deep copy

    def violations(self) -> list[str]:
        """Every rule the spec breaks, one sentence each naming the field and value."""
        return list(self._native.violations())

    def validate(self) -> None:
        """Raises InvalidSpecError listing every violation, when there is any."""
        self._native.validate()

    @property
    def fc1_rows(self) -> int:
        return self._native.fc1_rows()

    def local_problem(self) -> dict[str, Any]:
        """What this TP/EP rank runs (moekit::derive_local)."""
        return self._native.local_problem()

    def __getattr__(self, name: str) -> Any:
        fields = object.__getattribute__(self, "_fields")
        if name in fields:
            value = fields[name]
            return dict(value) if isinstance(value, dict) else value
        raise AttributeError(f"Spec has no field '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Spec is immutable; use spec.replace(...)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Spec) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"moekit.Spec(**{self._fields!r})"


def _as_spec(spec: Union[Spec, str]) -> Spec:
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, str):
        return Spec.from_preset(spec)
    raise InvalidArgumentError(f"spec is a {type(spec).__name__}, not a moekit.Spec or a preset name")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    family: str  # the model family its checkpoints use (load_weights)
    spec: Spec


def presets() -> list[Preset]:
    """The built-in layer shapes of real models, in order."""
    return [Preset(n, d, f, Spec._wrap(_native.NativeSpec.from_json(s), f))
            for n, d, f, s in _native.presets()]


def model_families() -> dict[str, str]:
    """Name -> description of each checkpoint layout load_weights reads."""
    return dict(_native.model_families())


def environment() -> dict[str, Any]:
    """The machine and build as the resolver sees them (GPUs, CUDA versions, fingerprint)."""
    return _native.environment()


# ---- Resolution ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejection:
    stage: str  # format, gpu_generation, build, activation, routing, feature, ...
    reason: str  # one sentence with the values


@dataclass(frozen=True)
class Candidate:
    id: str
    family: str
    priority: int
    eligible: bool
    chosen: bool
    rejection: Optional[Rejection]


@dataclass(frozen=True)
class Degradation:
    requested: str
    chosen: str
    reason: Rejection


@dataclass(frozen=True)
class Resolution:
    """Which implementation runs the layer here, and why not each other one."""

    request: str
    chosen: Optional[str]  # None: nothing can run it (see candidates)
    candidates: tuple[Candidate, ...]
    degraded_from: Optional[Degradation]
    environment_fingerprint: str
    spec: Spec
    json: str  # exactly what `moekit resolve --json` prints for the same spec and backend

    @property
    def ok(self) -> bool:
        return self.chosen is not None

    @classmethod
    def _from_json(cls, text: str) -> "Resolution":
        j = json.loads(text)

        def rejection(r: dict) -> Rejection:
            return Rejection(r["stage"], r["reason"])

        d = j["degraded_from"]
        return cls(
            request=j["request"],
            chosen=j["chosen"],
            candidates=tuple(Candidate(c["id"], c["family"], c["priority"], c["eligible"],
                                       c["chosen"],
                                       None if c["rejection"] is None else rejection(c["rejection"]))
                             for c in j["candidates"]),
            degraded_from=None if d is None else Degradation(d["requested"], d["chosen"],
                                                             rejection(d["reason"])),
            environment_fingerprint=j["environment_fingerprint"],
            spec=Spec.from_json(json.dumps(j["spec"])),
            json=text,
        )


def resolve(spec: Union[Spec, str], backend: str = "auto") -> Resolution:
    """What would run `spec` here for `backend` ("auto", a family or an implementation id)."""
    return Resolution._from_json(_native.resolve(_as_spec(spec)._native, backend))


# ---- Weights -------------------------------------------------------------------------------------


# moekit.torch_op once torch is imported (never imported by moekit itself): plain module globals,
# so that torch.compile traces MoeLayer.__call__ down to the custom op.
_torch_op: Any = None


def _torch_module() -> Any:
    global _torch_op
    if _torch_op is None and "torch" in sys.modules:
        from . import torch_op
        _torch_op = torch_op
    return _torch_op


def _is_torch(x: Any) -> bool:
    op = _torch_op if _torch_op is not None else _torch_module()
    return op is not None and isinstance(x, op.torch.Tensor)


def _host_array(x: Any) -> Any:
    """numpy where it can hold the dtype (bf16 and fp8 it cannot), else the DLPack array."""
    try:
        import numpy
        return numpy.from_dlpack(x)
    except Exception:  # numpy absent, or a dtype numpy has no type for
        return x


class Weights:
    """One layer's expert weights on the host, as the layer reads them (copied once)."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @classmethod
    def from_tensors(cls, spec: Spec, tensors: Mapping[str, Any]) -> "Weights":
        """From a dict in the documented layout (module docstring); torch tensors may be on GPU."""
        host = {k: (v.detach().cpu() if _is_torch(v) else v) for k, v in tensors.items()}
        return cls(_native.NativeWeights.from_tensors(spec._native, host))

    @classmethod
    def random(cls, spec: Spec, seed: int = 1) -> "Weights":
        """Deterministic random weights (what `moekit run --seed` draws for non-16-bit formats)."""
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise InvalidArgumentError(f"seed {seed!r} is not an integer in [0, 2^64)")
        return cls(_native.NativeWeights.random(spec._native, seed))

    @property
    def spec(self) -> Spec:
        return Spec._wrap(self._native.spec())

    def tensors(self) -> dict[str, Any]:
        """The documented dict (unsharded specs): numpy arrays where numpy holds the dtype."""
        return {k: _host_array(v) for k, v in self._native.tensors().items()}

    def save(self, path: str, family: str = "moekit", layer: int = 0) -> None:
        """A safetensors file laid out as `family`'s checkpoints are (unsharded specs)."""
        self._native.save(path, family, layer)


def load_weights(paths: Union[str, Sequence[str]], spec: Union[Spec, str], *,
                 family: Optional[str] = None, layer: int = 0) -> Weights:
    """One layer's experts from checkpoint files, folders or *.safetensors.index.json.

    `family` names the layout (model_families()); a spec made from a preset defaults to the
    preset's. For a TP/EP spec only the rank's shard is read.
    """
    spec = _as_spec(spec)
    family = family or spec._family
    if family is None:
        raise InvalidArgumentError("load_weights needs family= (model_families() lists them) "
                                   "for a spec that does not come from a preset")
    paths = [paths] if isinstance(paths, str) else list(paths)
    return Weights(_native.NativeWeights.load(paths, family, layer, spec._native))


def load_tensors(path: str) -> dict[str, Any]:
    """Every tensor of a safetensors file (numpy arrays where numpy holds the dtype)."""
    return {k: _host_array(v) for k, v in _native.load_tensors(path).items()}


def save_tensors(path: str, tensors: Mapping[str, Any],
                 metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes host tensors to a safetensors file (replaced atomically)."""
    _native.save_tensors(path, dict(tensors), dict(metadata or {}))


# ---- Layer ---------------------------------------------------------------------------------------


def _parse_device(device: Any) -> tuple[Optional[str], int]:
    """None (wherever the resolver's choice runs), ("cpu", 0) or ("cuda", index)."""
    if device is None:
        return None, 0
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return "cuda", device
    text = str(device)  # also torch.device
    if text == "cpu":
        return "cpu", 0
    if text == "cuda":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return "cuda", torch.cuda.current_device()
        return "cuda", 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise InvalidArgumentError(f"device {device!r} is not 'cpu', 'cuda', 'cuda:N' or a GPU index")


def _stream_handle(stream: Any) -> int:
    if stream is None:
        return 0
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if isinstance(stream, int) and stream >= 0:
        return stream
    raise InvalidArgumentError(f"stream {stream!r} is not a CUDA stream handle or stream object")


class MoeLayer:
    """One MoE layer: resolved, weights prepared, workspace sized for max_tokens.

    backend: "auto", a family ("reference", "cutlass", "mx") or an implementation id; device: "cpu"
    (the CPU reference), "cuda" / "cuda:N" / an index (a GPU implementation on that device), or
    None (whatever the resolver chooses). When nothing can run the layer, UnsupportedError
    carries the resolver's report (also: moekit.resolve(spec)).
    """

    def __init__(self, spec: Union[Spec, str], weights: Union[Weights, Mapping[str, Any]],
                 backend: str = "auto", *, max_tokens: Optional[int] = None,
                 device: Any = None) -> None:
        spec = _as_spec(spec)
        if max_tokens is not None:
            spec = spec.replace(max_tokens=max_tokens)
        if not isinstance(weights, Weights):
            if not isinstance(weights, Mapping):
                raise InvalidArgumentError(
                    f"weights is a {type(weights).__name__}, not a moekit.Weights or a dict of tensors")
            weights = Weights.from_tensors(spec, weights)
        kind, index = _parse_device(device)
        if kind == "cpu" and backend == "auto":
            backend = "reference"
        self._native = _native.NativeLayer(spec._native, weights._native, backend, index)
        self._spec = spec
        self._on_device = bool(self._native.on_device())
        self._device_index = index
        impl = self._native.implementation_id()
        if kind == "cpu" and self._on_device:
            raise InvalidArgumentError(f"device 'cpu' was asked for, but backend '{backend}' chose "
                                       f"{impl}, which runs on CUDA")
        if kind == "cuda" and not self._on_device:
            passed_over = [c.rejection.reason for c in self.resolution.candidates
                           if c.rejection is not None and c.family != "reference"]
            raise UnsupportedError(f"device '{device}' was asked for, but backend '{backend}' "
                                   f"chose {impl}, which runs on the host; "
                                   + (" ".join(passed_over) or "no GPU implementation was asked for"))
        self._op_id: Optional[int] = None
        if _torch_module() is not None:  # registered now, not inside a first call being captured
            self._torch_op_id()

    @property
    def spec(self) -> Spec:
        return self._spec

    @property
    def implementation(self) -> str:
        """The implementation id that runs the forward (e.g. cpu.reference)."""
        return self._native.implementation_id()

    @property
    def device(self) -> str:
        return f"cuda:{self._device_index}" if self._on_device else "cpu"

    @property
    def resolution(self) -> Resolution:
        return Resolution._from_json(self._native.resolution_json())

    @property
    def workspace_bytes(self) -> int:
        return self._native.workspace_bytes()

    def poll_errors(self) -> None:
        """Waits for the layer's GPU work; raises the first error the device found (bad ids)."""
        self._native.poll_errors()

    def _torch_op_id(self) -> int:
        """This layer's number in torch.ops.moekit.* (registered on first need)."""
        if self._op_id is None:
            self._op_id = _torch_module().register(self)
        return self._op_id

    def __call__(self, hidden: Any, router_logits: Any = None, *, topk_ids: Any = None,
                 topk_weights: Any = None, out: Any = None, stream: Any = None) -> Any:
        """The layer's output [T, H] for hidden [T, H] and router_logits [T, E] fp32 (or, for
        external routing, topk_ids [T, k] int32 and topk_weights [T, k] fp32).

        Torch tensors: on torch's current stream, through torch.ops.moekit.moe_forward when
        compiling. Other producers on CUDA: on `stream` (a handle or stream object; cupy's
        current stream for cupy arrays; else the default stream), exported with
        __dlpack__(stream=...) so the producer orders its work before it. `out` is written and
        returned when given; else the output is allocated in the input's framework (its
        empty_like; frameworks whose arrays are immutable, such as jax, need `out=` from one
        whose arrays are writable: numpy, torch, cupy).
        """
        if _is_torch(hidden):
            return _torch_op.call(self, hidden, router_logits, topk_ids, topk_weights, out, stream)
        if out is None:
            out = _empty_like(hidden)
        if self._on_device:
            handle = _stream_handle(stream if stream is not None else _current_stream(hidden))
            dl_stream = handle if handle != 0 else 1  # DLPack: 1 is the legacy default stream
            self._native.forward(_dlpack(hidden, dl_stream), _dlpack(router_logits, dl_stream),
                                 _dlpack(topk_ids, dl_stream), _dlpack(topk_weights, dl_stream),
                                 _dlpack(out, dl_stream), handle)
        else:
            self._native.forward(hidden, router_logits, topk_ids, topk_weights, out, 0)
        return out

    forward = __call__

    def _forward_native(self, hidden: Any, router_logits: Any, topk_ids: Any, topk_weights: Any,
                        out: Any, stream: int) -> None:
        self._native.forward(hidden, router_logits, topk_ids, topk_weights, out, stream)

    def __repr__(self) -> str:
        return f"moekit.MoeLayer({self.implementation} on {self.device})"


def _dlpack(x: Any, stream: int) -> Any:
    """x's DLPack capsule, exported for use on `stream` (None stays None)."""
    if x is None:
        return None
    try:
        return x.__dlpack__(stream=stream)
    except (AttributeError, TypeError):
        return x  # no stream-aware export: nanobind imports it as it can


def _current_stream(x: Any) -> int:
    if type(x).__module__.startswith("cupy"):
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _empty_like(x: Any) -> Any:
    """An uninitialized array of x's shape, dtype and device, in x's framework."""
    if type(x).__module__ == "numpy":
        import numpy
        return numpy.empty(x.shape, dtype=x.dtype)
    namespace = getattr(x, "__array_namespace__", None)
    if namespace is not None:
        return namespace().empty_like(x)
    raise InvalidArgumentError(f"cannot allocate an output like a {type(x).__name__}; pass out=")
