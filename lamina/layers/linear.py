"""Linear layers, tensor-parallel aware and quantization-method aware.

Every linear layer owns a `QuantMethod` that creates its parameters, post-processes them once
all weights are loaded, and applies the layer. Every parameter carries a `weight_loader`
attribute: `param.weight_loader(param, loaded_weight[, shard_id])` copies this rank's part of a
checkpoint tensor into it, so tensor parallelism and quantized methods slot in without touching
the models.

Fused layouts (output rows of the fused weight, one rank):

    QKVParallelLinear:          | q: num_heads*head_dim | k: num_kv_heads*head_dim | v: ... |
    MergedColumnParallelLinear: | shard 0 (gate) | shard 1 (up) |
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lamina.config import KernelChoice
from lamina.distributed.communication import all_reduce
from lamina.distributed.parallel_state import current_group
from lamina.layers.cpu_matmul import weight_major_matmul
from lamina.layers.dispatch import DEFAULT_KERNELS, gemv_for, pdl_for, weight_major_for


def tensor_parallel_rank_and_size() -> tuple[int, int]:
    """(rank, world size) of the tensor-parallel group the model is being built for
    (lamina.distributed.parallel_state.building; (0, 1) outside it)."""
    group = current_group()
    return group.rank, group.size


def set_weight_attrs(param: nn.Parameter, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        setattr(param, key, value)


def copy_checked(param: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    """Copy `loaded` into `param` (casting dtype), refusing a shape mismatch with a clear message.

    `loaded` may also be a lazy checkpoint slice (lamina.loader.weights.LazySlice: `shape`, `narrow`,
    `materialize`): under tensor parallelism a rank reads only its own part of the file, here."""
    if param.shape != loaded.shape:
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                         f"the model expects {tuple(param.shape)}")
    if not isinstance(loaded, torch.Tensor):
        loaded = loaded.materialize()
    with torch.no_grad():
        param.copy_(loaded)


class QuantMethod(ABC):
    """How a linear layer stores its weight and computes `x @ W^T (+ b)`."""

    @abstractmethod
    def create_weights(self, layer: LinearBase, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        """Register this rank's parameters on `layer` (sizes are per rank)."""

    def process_after_loading(self, layer: LinearBase) -> None:
        """Repack / transform weights once every checkpoint tensor has been copied in."""

    @abstractmethod
    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Compute the layer's output for `x` [..., input_size]."""


def small_batch_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       kernels: KernelChoice = DEFAULT_KERNELS) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias). A decode step's few rows go to the Triton GEMV where dispatch
    allows it (1.04-3.9x cuBLAS on the H200 at one row: lamina/bench/gemv_sweep.py), a few float32 rows on the
    CPU to weight_major_matmul where it was measured faster on this machine (lamina/layers/cpu_matmul.py), the
    rest to F.linear."""
    gemv = gemv_for(x, weight, kernels)
    if gemv is not None:
        out = gemv.gemv(x.reshape(-1, x.shape[-1]), weight, bias, pdl=pdl_for(x, kernels))
        return out.view(*x.shape[:-1], weight.shape[0])
    if weight_major_for(x, weight):
        return weight_major_matmul(x, weight, bias)
    return F.linear(x, weight, bias)


class DenseLinear(nn.Linear):
    """An nn.Linear (the same parameters, names and autograd) whose forward goes through small_batch_matmul, so
    that the small networks beside a model (EAGLE and Medusa heads) take the same few-row paths as its layers
    (`kernels`: the model's KernelChoice)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None, dtype: Any = None,
                 kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return small_batch_matmul(x, self.weight, self.bias, self.kernels)


class UnquantizedLinearMethod(QuantMethod):
    """A plain dense weight [output_size, input_size] in the model dtype; decode-sized inputs may take the
    Triton GEMV (the layer's KernelChoice.gemv, decided by lamina.layers.dispatch)."""

    def create_weights(self, layer: LinearBase, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype),
                              requires_grad=False)
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0, "weight_loader": layer.weight_loader})
        layer.register_parameter("weight", weight)

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return small_batch_matmul(x, layer.weight, bias, layer.kernels)


class LinearBase(nn.Module):
    """Shared plumbing: sizes per rank, the quant method, an optional bias of the output size, and the
    model's KernelChoice (which the quant method passes to lamina.layers.dispatch)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool,
                 quant_method: QuantMethod | None = None, params_dtype: torch.dtype | None = None,
                 kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.tp_group = current_group()
        self.tp_rank, self.tp_size = self.tp_group.rank, self.tp_group.size
        self.kernels = kernels
        self.input_size = input_size
        self.output_sizes = output_sizes
        self.output_size = sum(output_sizes)
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.quant_method = quant_method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, input_size, output_sizes, self.params_dtype)
        if bias:
            b = nn.Parameter(torch.empty(self.output_size, dtype=self.params_dtype), requires_grad=False)
            set_weight_attrs(b, {"output_dim": 0, "weight_loader": self.weight_loader})
            self.register_parameter("bias", b)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        raise NotImplementedError

    def shard_index(self, shard_id: Any) -> int:
        """Which of `output_sizes` the checkpoint shard `shard_id` fills (0 for an unfused layer)."""
        return 0 if shard_id is None else shard_id

    def _shard_of(self, loaded: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
        """This rank's slice of a full checkpoint tensor along `dim` (`size` rows per rank)."""
        if dim is None or self.tp_size == 1:
            return loaded
        return loaded.narrow(dim, self.tp_rank * size, size)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}"


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_method: QuantMethod | None = None, kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__(input_size, [output_size], bias, quant_method, kernels=kernels)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        copy_checked(param, loaded, "ReplicatedLinear")


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks: y_r = x @ W_r^T, no communication."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 quant_method: QuantMethod | None = None, kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        _, tp_size = tensor_parallel_rank_and_size()
        for size in output_sizes:
            if size % tp_size:
                raise ValueError(f"output size {size} is not divisible by tensor_parallel_size {tp_size}")
        super().__init__(input_size, [s // tp_size for s in output_sizes], bias, quant_method, kernels=kernels)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        dim = getattr(param, "output_dim", None)
        copy_checked(param, self._shard_of(loaded, dim, param.shape[dim] if dim is not None else 0),
                     type(self).__name__)

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, offset: int, size: int,
                    what: str) -> None:
        """Copy this rank's part of one fused component into rows [offset, offset + size) of `param`."""
        dim = getattr(param, "output_dim", None)
        if dim is None:  # e.g. a per-tensor scale: the same for every component
            copy_checked(param, loaded, what)
            return
        copy_checked(param.narrow(dim, offset, size), self._shard_of(loaded, dim, size), what)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel layers with the same input, fused (gate_up: shard ids 0 and 1)."""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"MergedColumnParallelLinear shard_id must be one of "
                             f"{list(range(len(self.output_sizes)))}, got {shard_id!r}")
        offset = sum(self.output_sizes[:shard_id])
        self._load_shard(param, loaded, offset, self.output_sizes[shard_id],
                         f"MergedColumnParallelLinear shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused into one matmul; heads are split across ranks.

    KV heads are replicated when there are more ranks than KV heads (each rank keeps one).
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, quant_method: QuantMethod | None = None,
                 kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        _, tp_size = tensor_parallel_rank_and_size()
        if num_heads % tp_size:
            raise ValueError(f"num_attention_heads {num_heads} is not divisible by "
                             f"tensor_parallel_size {tp_size}")
        if num_kv_heads % tp_size and tp_size % num_kv_heads:
            raise ValueError(f"num_key_value_heads {num_kv_heads} and tensor_parallel_size {tp_size}: one must "
                             "divide the other (KV heads are split across ranks, or replicated)")
        self.head_dim = head_dim
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_replicas = max(1, tp_size // num_kv_heads)
        per_rank_total = [self.num_heads * head_dim * tp_size,
                          self.num_kv_heads * head_dim * tp_size, self.num_kv_heads * head_dim * tp_size]
        super().__init__(hidden_size, per_rank_total, bias, quant_method, kernels=kernels)

    def shard_index(self, shard_id: Any) -> int:
        return ("q", "k", "v").index(shard_id)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        layout = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
        if shard_id not in layout:
            raise ValueError(f"QKVParallelLinear shard_id must be one of {list(layout)}, got {shard_id!r}")
        offset, size = layout[shard_id]
        dim = getattr(param, "output_dim", None)
        if shard_id != "q" and dim is not None and self.kv_replicas > 1:
            # Several ranks share one KV head: rank r keeps head r // replicas.
            loaded = loaded.narrow(dim, (self.tp_rank // self.kv_replicas) * size, size)
            copy_checked(param.narrow(dim, offset, size), loaded, f"QKVParallelLinear {shard_id}")
            return
        self._load_shard(param, loaded, offset, size, f"QKVParallelLinear {shard_id}")


class RowParallelLinear(LinearBase):
    """Input features split across ranks: y = sum_r x_r @ W_r^T (+ b once), an all-reduce at TP > 1."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_method: QuantMethod | None = None, kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        _, tp_size = tensor_parallel_rank_and_size()
        if input_size % tp_size:
            raise ValueError(f"input size {input_size} is not divisible by tensor_parallel_size {tp_size}")
        super().__init__(input_size // tp_size, [output_size], bias, quant_method, kernels=kernels)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        dim = getattr(param, "input_dim", None)
        copy_checked(param, self._shard_of(loaded, dim, param.shape[dim] if dim is not None else 0),
                     "RowParallelLinear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added after the all-reduce so that it is counted once, not tp_size times.
        out = all_reduce(self.quant_method.apply(self, x, None), self.tp_group)
        return out if self.bias is None else out + self.bias
