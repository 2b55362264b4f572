"""A GGUF model's token embedding read from the file's own blocks: only the rows a pass looks up are de-quantized,
so that a model decoding on its own blocks never holds a de-quantized copy of its vocabulary (Qwen2.5's 151,936 rows
of 1,536 are 467 MB in bf16, beside a ~1 GB file).

The rows are de-quantized by gguf-py, as the de-quantized copy is (model/gguf/network.py), and cast to the network's
dtype the same way: a looked-up row is that copy's row, value for value. The blocks stay memory-mapped: the pages of
the rows a conversation has used are the file's (the kernel's page cache, shared and reclaimable), not the heap's.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn

from model.gguf.blocks import raw_blocks
from model.gguf.header import GGUFHeader, TensorInfo

_CHUNK_ROWS = 4096  # rows de-quantized at a time when every row is read: a large vocabulary never whole in fp32


def dequantized(blocks: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """Rows of a tensor's blocks `[rows, row bytes]` as fp32 `[rows, elements]`, as gguf-py de-quantizes them."""
    if kind == GGMLQuantizationType.F32:
        return np.array(blocks.view(np.float32))  # a copy: the file is mapped read-only
    if kind == GGMLQuantizationType.F16:
        return blocks.view(np.float16).astype(np.float32)
    return np.asarray(dequantize(blocks, kind), dtype=np.float32).reshape(blocks.shape[0], -1)


def dense_rows(header: GGUFHeader, info: TensorInfo, dtype: torch.dtype) -> torch.Tensor:
    """The whole tensor de-quantized to `dtype` `[rows, elements]`, a chunk of rows at a time."""
    raw = raw_blocks(header, info)
    kind = GGMLQuantizationType[info.type_name]
    out = torch.empty(raw.shape[0], int(info.shape[0]), dtype=dtype)
    for first in range(0, raw.shape[0], _CHUNK_ROWS):
        part = np.asarray(raw[first : first + _CHUNK_ROWS])
        out[first : first + part.shape[0]] = torch.from_numpy(dequantized(part, kind)).to(dtype)
    return out


class BlockEmbedding(nn.Module):
    """`nn.Embedding`'s lookup over the file's blocks of `token_embd.weight`: `forward(ids)` de-quantizes the distinct
    ids' rows only, rounded to `dtype` as the de-quantized copy is. Cast or moved (`.float()`, `.to()`), it returns
    those rows in the new dtype and device, as that copy would; it holds no parameter, so nothing trains or saves
    it."""

    def __init__(self, header: GGUFHeader, info: TensorInfo, dtype: torch.dtype) -> None:
        super().__init__()
        self._header, self._info = header, info
        self._blocks = raw_blocks(header, info)  # memory-mapped: pages read as rows are looked up
        self._kind = GGMLQuantizationType[info.type_name]
        self._rounding = dtype
        self.num_embeddings, self.embedding_dim = int(self._blocks.shape[0]), int(info.shape[0])
        # an empty buffer, cast and moved with the module: the dtype and device of the rows it returns
        self.register_buffer("_like", torch.empty(0, dtype=dtype), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1).cpu()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"token ids outside the vocabulary of {self.num_embeddings}")
        unique, inverse = torch.unique(flat, return_inverse=True)
        rows = dequantized(np.asarray(self._blocks[unique.numpy()]), self._kind)
        out = torch.from_numpy(rows).to(self._rounding)[inverse]
        return out.view(*input_ids.shape, self.embedding_dim).to(self._like)

    def mean_row(self) -> torch.Tensor:
        """The mean of every row in fp32 (`weight.float().mean(0)` of the dense copy, up to the order of the sums):
        read through a mapping of its own, released after, so that the rows stay off this process's resident set."""
        total = torch.zeros(self.embedding_dim, dtype=torch.float64)
        for first in range(0, self.num_embeddings, _CHUNK_ROWS):
            part = _copied_rows(self._header, self._info, first, first + _CHUNK_ROWS)
            total += torch.from_numpy(dequantized(part, self._kind)).to(self._rounding).double().sum(0)
        return (total / self.num_embeddings).float()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self._info.type_name} blocks of {self._header.path.name}"


def _copied_rows(header: GGUFHeader, info: TensorInfo, first: int, last: int) -> np.ndarray:
    """Rows `first:last` of a tensor's blocks, copied out of a mapping that is released on return."""
    return np.array(raw_blocks(header, info)[first:last])
