"""Token embedding and LM head, vocab-parallel: each rank holds a contiguous vocab slice.

    rank r holds rows [r * per_rank, min((r + 1) * per_rank, vocab))     per_rank = ceil(vocab / tp_size)
    embedding:  ids outside the slice look up row 0, are zeroed, and the ranks' rows are summed (all-reduce)
    LM head:    each rank's [N, per_rank] logits are gathered along the vocab, the padding cut off

The last rank's slice is short when tp_size does not divide the vocab: its padding rows stay zero.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lamina.config import KernelChoice
from lamina.distributed.communication import all_gather, all_reduce
from lamina.distributed.parallel_state import current_group
from lamina.layers.dispatch import DEFAULT_KERNELS
from lamina.layers.linear import QuantMethod, copy_checked, set_weight_attrs, small_batch_matmul


def _load_vocab_slice(param: nn.Parameter, loaded: torch.Tensor, rank: int, what: str) -> None:
    """Copy this rank's rows of a full [vocab, hidden] checkpoint tensor into `param` (zero padding rows)."""
    per_rank = param.shape[0]
    start = min(rank * per_rank, loaded.shape[0])
    rows = min(per_rank, loaded.shape[0] - start)
    if rows == per_rank:
        copy_checked(param, loaded.narrow(0, start, rows), what)
        return
    with torch.no_grad():
        param[rows:].zero_()
    copy_checked(param[:rows], loaded.narrow(0, start, rows), what)


class VocabEmbedding(nn.Module):
    """Embedding table [vocab_size, hidden]; rank r holds rows [r * per_rank, (r + 1) * per_rank)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_group = current_group()
        self.tp_rank, self.tp_size = self.tp_group.rank, self.tp_group.size
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.num_embeddings_per_partition
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim),
                                   requires_grad=False)
        set_weight_attrs(self.weight, {"output_dim": 0, "weight_loader": self.weight_loader})

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if self.tp_size == 1:
            copy_checked(param, loaded, type(self).__name__)
            return
        if loaded.shape[0] != self.num_embeddings:
            raise ValueError(f"{type(self).__name__}: checkpoint tensor has {loaded.shape[0]} rows, the model "
                             f"expects vocab_size {self.num_embeddings}")
        _load_vocab_slice(param, loaded, self.tp_rank, type(self).__name__)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings_per_partition)
        hidden = F.embedding(local.masked_fill(outside, 0), self.weight)
        hidden.masked_fill_(outside.unsqueeze(-1), 0.0)
        return all_reduce(hidden, self.tp_group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class ParallelLMHead(nn.Module):
    """The output projection hidden -> vocab; with `tied_to`, it shares the embedding's weight (and slice).
    Decode-sized batches may take the Triton GEMV (KernelChoice.gemv, decided by lamina.layers.dispatch). An
    untied head may be quantized: `quant_method` then owns its parameters, as in a linear layer."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 tied_to: VocabEmbedding | None = None, kernels: KernelChoice = DEFAULT_KERNELS,
                 quant_method: QuantMethod | None = None) -> None:
        super().__init__()
        self.tp_group = current_group()
        self.tp_rank, self.tp_size = self.tp_group.rank, self.tp_group.size
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.kernels = kernels
        self.quant_method = None if tied_to is not None else quant_method
        if tied_to is not None:
            self.weight = tied_to.weight
            return
        per_rank = -(-num_embeddings // self.tp_size)
        if self.quant_method is not None:
            self.quant_method.create_weights(self, embedding_dim, [per_rank], torch.get_default_dtype())
            return
        self.weight = nn.Parameter(torch.empty(per_rank, embedding_dim), requires_grad=False)
        set_weight_attrs(self.weight, {"output_dim": 0, "weight_loader": self.weight_loader})

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if self.tp_size == 1:
            copy_checked(param, loaded, type(self).__name__)
            return
        _load_vocab_slice(param, loaded, self.tp_rank, type(self).__name__)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32 logits (the matmul runs in the model dtype)."""
        if self.quant_method is not None:
            logits = self.quant_method.apply(self, hidden, None)
        else:
            logits = small_batch_matmul(hidden, self.weight, kernels=self.kernels)
        if self.tp_size > 1:
            logits = all_gather(logits, self.tp_group, dim=-1)[..., :self.num_embeddings]
        return logits.float()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
