"""A GGUF's own blocks in the decoding kernels (model/gguf/blocks.py, model/runtime/packed.py): each format unpacks
to exactly gguf-py's de-quantization, the kernels multiply by it within the activations' rounding, a row's result
does not depend on the rows beside it, members of mixed formats compute their own products, and every CPU's build
gives the same bits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from model.gguf import blocks as blocks_module
from model.gguf.blocks import FORMATS, Unpacked, packed, raw_blocks, unpacked, unreadable
from model.gguf.header import read_header
from model.process.threads import torch_threads
from model.runtime import quant_kernels
from model.runtime.int4_weights import Int4Linear, Q4Blocks, available, check_rows_independent
from model.runtime.packed import GROUP, PackedLinear
from scripts.report_lib.gguf_parts import K_TYPES
from scripts.report_lib.tiny_gguf import K_SHAPE, write_model

T = GGMLQuantizationType
pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny llama file of each format (its layers and embedding in that format; rows of 256 for the K-quants,
    whose blocks are random bytes with small scales)."""
    folder = tmp_path_factory.mktemp("blocks")
    return {name: write_model(folder / f"{name}.gguf", "llama", T[name], seed=1,
                              shape=K_SHAPE if T[name] in K_TYPES else None).path for name in FORMATS}


def weight_of(path: Path, name: str = "blk.0.ffn_down.weight") -> tuple[Unpacked, np.ndarray, str]:
    """(the tensor unpacked, gguf-py's de-quantization of it, its type)."""
    header = read_header(path)
    info = header.tensor(name)
    expected = dequantize(np.asarray(raw_blocks(header, info)), T[info.type_name]).reshape(info.shape[::-1])
    return unpacked(header, info), expected.astype(np.float32), info.type_name


def values(weight: Unpacked) -> torch.Tensor:
    n, k = weight.values.shape
    d, m = weight.d, weight.m
    if weight.sub is not None:  # a K-quant: a sub-block's scale is its super-block's times its integer, exact
        d = d.repeat_interleave(weight.sub.scale.shape[1] // d.shape[1], dim=1) * weight.sub.scale.float()
        if m is not None and weight.sub.min is not None:
            m = m.repeat_interleave(weight.sub.min.shape[1] // m.shape[1], dim=1) * weight.sub.min.float()
    groups = d.shape[1]  # of 32, or of 16 (Q6_K)
    w = weight.values.float().view(n, groups, k // groups) * d[..., None]
    return (w if m is None else w + m[..., None]).view(n, k)


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_each_format_unpacks_to_gguf_pys_dequantization(files: dict[str, Path], kind: str) -> None:
    weight, expected, _ = weight_of(files[kind])
    assert torch.equal(values(weight), torch.from_numpy(expected))


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_each_format_through_the_kernel_computes_the_files_weights(files: dict[str, Path], kind: str) -> None:
    """Activations with an outlier in every group: the products equal the fp32 products of the file's weights to
    ~1e-4 of the output's scale (the activations' two 8-bit parts: quant_matmul.c), or ~1e-2 from hi alone (llama.cpp's
    8-bit activations): drafting rows, and every row of a K-quant (its file was made for llama.cpp's coarser q8_K)."""
    weight, expected, _ = weight_of(files[kind])
    linear = PackedLinear([FORMATS[kind].pack(weight)], logits=True)
    x = torch.randn(5, expected.shape[1], generator=torch.Generator().manual_seed(0))
    x[:, ::GROUP] *= 40.0
    reference = x.double() @ torch.from_numpy(expected).double().t()
    coarse = linear(x, coarse=0).double()
    assert 3e-4 < (coarse - reference).abs().max() / reference.abs().max() < 3e-2
    if kind.endswith("_K"):
        assert torch.equal(linear(x).double(), coarse)
    else:
        error = (linear(x).double() - reference).abs().max() / reference.abs().max()
        assert error < 3e-4, error


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(files: dict[str, Path], kind: str) -> None:
    weight, _, _ = weight_of(files[kind], "blk.1.ffn_gate.weight")
    linear = PackedLinear([FORMATS[kind].pack(weight)])
    assert check_rows_independent(linear, linear.in_features)  # type: ignore[arg-type]


def test_members_of_mixed_formats_each_compute_their_own_product(files: dict[str, Path]) -> None:
    """A "Q4_K_M"-style fused linear: q in Q4_0, k in Q5_1, v in Q8_0, side by side in one call, each member's
    outputs the same bits as that member alone (drafting rows too)."""
    members = [FORMATS[kind].pack(weight_of(files[kind], f"blk.0.attn_{part}.weight")[0])
               for kind, part in (("Q4_0", "q"), ("Q5_1", "k"), ("Q8_0", "v"))]
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(3))
    fused = PackedLinear(members, logits=True)(x, coarse=4)
    alone = torch.cat([PackedLinear([m], logits=True)(x, coarse=4) for m in members], dim=-1)
    assert fused.shape == (6, 64 + 32 + 32) and torch.equal(fused, alone)


def test_q4_1_blocks_pack_as_the_bundled_models_int4_weights(files: dict[str, Path]) -> None:
    weight, _, _ = weight_of(files["Q4_1"])
    assert weight.m is not None
    ours = PackedLinear([FORMATS["Q4_1"].pack(weight)])
    bundled = Int4Linear.from_blocks(Q4Blocks(weight.values.int(), weight.d, weight.m))
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert torch.equal(ours(x), bundled(x))


def test_layers_of_other_types_are_named(tmp_path: Path) -> None:
    path = write_model(tmp_path / "mixed.gguf", "llama",
                       lambda name: T.F16 if "blk.1.ffn_up" in name else T.Q8_0).path
    assert unreadable(read_header(path)) == ["blk.1.ffn_up.weight F16"]


@pytest.mark.parametrize("cpu", sorted(quant_kernels.TARGETS))
def test_other_cpus_builds_compute_the_same_bits_for_every_format(files: dict[str, Path], cpu: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    built = quant_kernels.build(quant_kernels.TARGETS[cpu])  # every build compiles, here too
    if not quant_kernels.runs_here(cpu):
        pytest.skip(f"this CPU cannot run the {cpu} build ({', '.join(quant_kernels.TARGET_FLAGS[cpu])})")
    linears = [PackedLinear([FORMATS[kind].pack(weight_of(files[kind])[0])], logits=True) for kind in FORMATS]
    inputs = [torch.randn(7, linear.in_features, generator=torch.Generator().manual_seed(2)) for linear in linears]
    here = [linear(x, coarse=5) for linear, x in zip(linears, inputs, strict=True)]
    monkeypatch.setattr(quant_kernels, "_load", lambda: (built, None))
    for linear, x, expected in zip(linears, inputs, here, strict=True):
        assert torch.equal(linear(x, coarse=5), expected)


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_a_tensor_packed_in_chunks_of_rows_is_the_tensor_packed_at_once(
    files: dict[str, Path], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head is packed `PACK_ROWS` rows at a time (the load's peak memory); the kernel gets the same tensors."""
    header = read_header(files[kind])
    info = header.tensor("blk.0.ffn_down.weight")
    whole = FORMATS[kind].pack(unpacked(header, info))
    monkeypatch.setattr(blocks_module, "PACK_ROWS", 16)
    assert whole.n > 16  # several chunks
    chunked = packed(header, info)
    assert (chunked.n, chunked.k, chunked.packing, chunked.scales) == (whole.n, whole.k, whole.packing, whole.scales)
    for name in ("q", "d", "m", "sub"):
        a, b = getattr(chunked, name), getattr(whole, name)
        assert (a is None and b is None) or torch.equal(a, b), name
