"""moekit as PyTorch custom ops, so that torch.compile and CUDA graph capture see one op.

    torch.ops.moekit.moe_forward(layer_id, hidden, router_logits, topk_ids, topk_weights) -> Tensor
    torch.ops.moekit.moe_forward_out(layer_id, hidden, router_logits, topk_ids, topk_weights, out)

layer_id is MoeLayer's registration number (MoeLayer registers itself when torch is imported;
moekit.torch_op.register(layer) otherwise). Both run on torch's current CUDA stream (the capture
stream while a torch.cuda.graph is being captured), allocate nothing but the output (from
torch's allocator: the graph's pool under capture) and never synchronize. Their fake
implementations give the output's shape, dtype and device, so torch.compile traces them without
running the layer. Imported by moekit only where torch is importable.
"""

import itertools
import threading
import weakref
from typing import Any, Optional

import torch

from ._errors import InvalidArgumentError

_layers: "dict[int, weakref.ref]" = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def register(layer: Any) -> int:
    """A number that names `layer` in the ops (held weakly: the ops never keep a layer alive)."""
    with _lock:
        key = next(_ids)

        def forget(_ref: "weakref.ref[Any]") -> None:
            _layers.pop(key, None)

        _layers[key] = weakref.ref(layer, forget)
    return key


def _layer(layer_id: int) -> Any:
    ref = _layers.get(layer_id)
    layer = ref() if ref is not None else None
    if layer is None:
        raise InvalidArgumentError(f"layer_id {layer_id} names no live moekit.MoeLayer")
    return layer


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _plain(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # DLPack refuses tensors that require grad; the op has no backward, so detach (no copy).
    return t.detach() if t is not None and t.requires_grad else t


def _forward(layer: Any, hidden: torch.Tensor, router_logits: Optional[torch.Tensor],
             topk_ids: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor],
             out: torch.Tensor) -> None:
    layer._forward_native(_plain(hidden), _plain(router_logits), _plain(topk_ids),
                          _plain(topk_weights), _plain(out), _stream(hidden))


def _run(layer_id: int, hidden: torch.Tensor, router_logits: Optional[torch.Tensor],
         topk_ids: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor],
         out: torch.Tensor) -> None:
    _forward(_layer(layer_id), hidden, router_logits, topk_ids, topk_weights, out)


@torch.library.custom_op("moekit::moe_forward", mutates_args=())
def moe_forward(layer_id: int, hidden: torch.Tensor, router_logits: Optional[torch.Tensor],
                topk_ids: Optional[torch.Tensor],
                topk_weights: Optional[torch.Tensor]) -> torch.Tensor:
    out = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
    _run(layer_id, hidden, router_logits, topk_ids, topk_weights, out)
    return out


@moe_forward.register_fake
def _moe_forward_fake(layer_id: int, hidden: torch.Tensor, router_logits: Optional[torch.Tensor],
                      topk_ids: Optional[torch.Tensor],
                      topk_weights: Optional[torch.Tensor]) -> torch.Tensor:
    return hidden.new_empty(hidden.shape)


@torch.library.custom_op("moekit::moe_forward_out", mutates_args=("out",))
def moe_forward_out(layer_id: int, hidden: torch.Tensor, router_logits: Optional[torch.Tensor],
                    topk_ids: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor],
                    out: torch.Tensor) -> None:
    _run(layer_id, hidden, router_logits, topk_ids, topk_weights, out)


@moe_forward_out.register_fake
def _moe_forward_out_fake(layer_id: int, hidden: torch.Tensor,
                          router_logits: Optional[torch.Tensor],
                          topk_ids: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor],
                          out: torch.Tensor) -> None:
    return None


def call(layer: Any, hidden: torch.Tensor, router_logits: Optional[torch.Tensor],
         topk_ids: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor],
         out: Optional[torch.Tensor], stream: Any) -> torch.Tensor:
    """MoeLayer.__call__ for torch tensors: the ops when compiling, else the direct path (the
    same work without the dispatcher's cost)."""
    if stream is not None:
        raise InvalidArgumentError("stream= is for non-torch tensors; torch tensors run on torch's "
                                   "current stream (use `with torch.cuda.stream(s):`)")
    if torch.compiler.is_compiling():
        layer_id = layer._torch_op_id()
        if out is None:
            return torch.ops.moekit.moe_forward(layer_id, hidden, router_logits, topk_ids,
                                                topk_weights)
        torch.ops.moekit.moe_forward_out(layer_id, hidden, router_logits, topk_ids, topk_weights,
                                         out)
        return out
    if out is None:
        out = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
    _forward(layer, hidden, router_logits, topk_ids, topk_weights, out)
    return out
