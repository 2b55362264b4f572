"""What a GGUF written for a test or a benchmark is made of: a byte-level BPE vocabulary with ChatML's control
tokens, and random blocks of ggml's block types with small, finite scales.

The tests' tiny files (tiny_gguf.py here) and the full-size files of scripts/bench/synthetic_gguf.py are built from
these.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.constants import GGML_QUANT_SIZES

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("h e", "Ġ t", "Ġt he")
K_TYPES = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K)
_T = GGMLQuantizationType
# Where a block's fp16 scale `d` sits, and its fp16 minimum (`dmin`, `m`) if it has one: the rest is random bytes
_SCALE_AT: dict[GGMLQuantizationType, tuple[int, int | None]] = {
    _T.Q4_0: (0, None), _T.Q5_0: (0, None), _T.Q8_0: (0, None), _T.Q4_1: (0, 2), _T.Q5_1: (0, 2),
    _T.Q4_K: (0, 2), _T.Q5_K: (0, 2), _T.Q6_K: (-2, None),
}


def byte_unicode() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (byte-level BPE's alphabet), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelled[byte] = chr(byte)
        else:
            spelled[byte] = chr(256 + extra)
            extra += 1
    return [spelled[byte] for byte in range(256)]


def vocabulary(size: int | None = None) -> tuple[list[str], list[int]]:
    """Tokens and their types: the bytes, the merged tokens of `MERGES`, then the chat's control tokens; with `size`,
    padded to `size` tokens by plain ones (`[extra N]`, which no merge makes) before the control tokens, as a real
    model's vocabulary is that large."""
    words = [*byte_unicode(), *("".join(merge.split(" ")) for merge in MERGES)]
    if size is not None:
        if size < len(words) + len(SPECIALS):
            raise ValueError(f"a vocabulary of {size} tokens cannot hold the {len(words) + len(SPECIALS)} needed")
        words += [f"[extra{index}]" for index in range(size - len(words) - len(SPECIALS))]
    tokens = [*words, *SPECIALS]
    types = [TokenType.NORMAL] * len(words) + [TokenType.CONTROL] * len(SPECIALS)
    return tokens, [int(t) for t in types]


def add_bpe_tokenizer(writer: GGUFWriter, tokens: list[str], types: list[int], eos: str = "<|im_end|>") -> None:
    """`vocabulary`'s tokens as a byte-level BPE tokenizer with `MERGES`, ChatML's template, `<|endoftext|>` as BOS
    (never added) and `eos` as EOS, as llama.cpp's converter writes a Qwen2.5 file's."""
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index(eos))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator,
                  scale: float = 0.01) -> np.ndarray:
    """Random blocks of `qtype` (gguf-py cannot quantize to the K-quants; random bytes are also much faster to make
    than quantized values) with every block's fp16 scale `scale` (and minimum `scale / 2`): `[rows, bytes]`."""
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, block_bytes), dtype=np.uint8)
    d = np.full((rows, cols // block, 1), scale, dtype=np.float16).view(np.uint8)
    d_at, m_at = _SCALE_AT[qtype]
    data[..., d_at : d_at + 2 or None] = d
    if m_at is not None:
        data[..., m_at : m_at + 2] = (d.view(np.float16) / 2).view(np.uint8)
    return data.reshape(rows, -1)
