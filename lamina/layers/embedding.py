"""Token embedding and LM head (vocab-parallel in shape: each rank holds a contiguous vocab slice)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lamina.config import KernelChoice
from lamina.layers.dispatch import DEFAULT_KERNELS
from lamina.layers.linear import (QuantMethod, copy_checked, set_weight_attrs, small_batch_matmul,
                                  tensor_parallel_rank_and_size)


class VocabEmbedding(nn.Module):
    """Embedding table [vocab_size, hidden]; rank r holds rows [r * per_rank, (r + 1) * per_rank)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tensor_parallel_rank_and_size()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim),
                                   requires_grad=False)
        set_weight_attrs(self.weight, {"output_dim": 0, "weight_loader": self.weight_loader})

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if self.tp_size > 1:
            start = self.tp_rank * self.num_embeddings_per_partition
            loaded = loaded[start:start + self.num_embeddings_per_partition]
        copy_checked(param, loaded, type(self).__name__)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            raise NotImplementedError("vocab-parallel embedding arrives with lamina.distributed")
        return F.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class ParallelLMHead(nn.Module):
    """The output projection hidden -> vocab; with `tied_to`, it shares the embedding's weight. Decode-sized
    batches may take the Triton GEMV (KernelChoice.gemv, decided by lamina.layers.dispatch). An untied head
    may be quantized: `quant_method` then owns its parameters, as in a linear layer."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 tied_to: VocabEmbedding | None = None, kernels: KernelChoice = DEFAULT_KERNELS,
                 quant_method: QuantMethod | None = None) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tensor_parallel_rank_and_size()
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
        if self.tp_size > 1:
            start = self.tp_rank * param.shape[0]
            loaded = loaded[start:start + param.shape[0]]
        copy_checked(param, loaded, type(self).__name__)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32 logits (the matmul runs in the model dtype)."""
        if self.tp_size > 1:
            raise NotImplementedError("vocab-parallel logits gather arrives with lamina.distributed")
        if self.quant_method is not None:
            return self.quant_method.apply(self, hidden, None).float()
        return small_batch_matmul(hidden, self.weight, kernels=self.kernels).float()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
