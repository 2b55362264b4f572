"""A GGUF file's header: its architecture, every tensor's type and shape, and the metadata the runtime needs; and
whether this runtime supports it, decided before anything heavy is loaded.

Read with a walk over the memory-mapped header (struct, no numpy), not gguf-py's `GGUFReader`: the reader builds a
numpy view per string, 3.4 s for SmolLM2's 49k-token vocabulary and merges on the 2-core machine, and a command checks
its `--model` before it loads anything. The walk keeps scalars and strings and only the length of arrays (the
vocabulary is the tokenizer's to read). Type ids and block sizes are gguf-py's (`gguf.constants`), which the tests hold
this reader to.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from model.errors import ModelError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
SUPPORTED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")
# Rope scalings the loader reproduces: none, or positions divided by a factor (`rope_frequency_divisors`)
SUPPORTED_ROPE_SCALINGS = ("none", "linear")
# Tokenizers transformers builds from a GGUF's metadata: byte-level BPE (Llama 3, Qwen, SmolLM) and sentencepiece
SUPPORTED_TOKENIZERS = ("gpt2", "llama")
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}

Value = int | float | bool | str


def supported_line() -> str:
    """What this runtime reads, for every refusal."""
    return (f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}; tensor types: "
            f"{', '.join(SUPPORTED_TYPES)}")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_name: str  # gguf-py's name of the ggml type ("Q4_K"), or "type N" for an id gguf-py does not know
    size: int  # bytes (0 for an unknown type)
    shape: tuple[int, ...]  # as ggml lists it: the row length first
    offset: int  # from the start of the data section


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """What a GGUF file says about itself; arrays are kept as their lengths (`array_lengths`)."""

    path: Path
    file_size: int
    data_start: int
    metadata: dict[str, Value]
    array_lengths: dict[str, int]
    tensors: tuple[TensorInfo, ...]
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(t.name for t in self.tensors))

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called `name` (KeyError when the file has none)."""
        found = next((t for t in self.tensors if t.name == name), None)
        if found is None:
            raise KeyError(name)
        return found

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def value(self, key: str) -> Value:
        """The architecture's own key (`qwen2.block_count` for "block_count"); ModelError when the file lacks it."""
        full = f"{self.architecture}.{key}"
        if full not in self.metadata:
            raise ModelError(f"{self.path} lacks the metadata {full}")
        return self.metadata[full]

    def optional(self, key: str) -> Value | None:
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def layers(self) -> int:
        return int(self.value("block_count"))

    @property
    def heads(self) -> int:
        return int(self.value("attention.head_count"))

    @property
    def kv_heads(self) -> int:
        return int(self.optional("attention.head_count_kv") or self.heads)

    @property
    def head_dim(self) -> int:
        stated = self.optional("attention.key_length") or self.optional("rope.dimension_count")
        return int(stated) if stated else int(self.value("embedding_length")) // self.heads

    @property
    def rope_theta(self) -> float:
        return float(self.optional("rope.freq_base") or 10000.0)

    @property
    def rope_scaling(self) -> tuple[str, float]:
        """(type, factor): "none" and 1.0 unless the file says otherwise."""
        kind = str(self.optional("rope.scaling.type") or "none")
        factor = float(self.optional("rope.scaling.factor") or 1.0)
        return (kind, factor) if kind != "none" and factor != 1.0 else ("none", 1.0)

    @property
    def rms_norm_eps(self) -> float:
        return float(self.value("attention.layer_norm_rms_epsilon"))

    @property
    def context_length(self) -> int | None:
        value = self.optional("context_length")
        return int(value) if value else None

    @property
    def vocab_size(self) -> int:
        return self.array_lengths.get("tokenizer.ggml.tokens", 0)

    @property
    def tied_head(self) -> bool:
        """llama.cpp writes `output.weight` only when the head is not the embedding matrix."""
        return "output.weight" not in self.names

    @property
    def chat_template(self) -> str | None:
        template = self.metadata.get("tokenizer.chat_template")
        return str(template) if template else None

    def token_id(self, name: str) -> int | None:
        """`tokenizer.ggml.<name>_token_id` (bos, eos, eot, eom, padding), None when absent."""
        value = self.metadata.get(f"tokenizer.ggml.{name}_token_id")
        return None if value is None else int(value)

    @property
    def type_counts(self) -> Counter[str]:
        return Counter(t.type_name for t in self.tensors)

    @property
    def data_end(self) -> int:
        return max((self.data_start + t.offset + t.size for t in self.tensors), default=self.data_start)

    def describe(self) -> str:
        """One line for a startup log: the architecture, the size and the tensor types."""
        types = ", ".join(f"{name} x{count}" for name, count in self.type_counts.most_common())
        size = self.file_size / 2**20
        return f"{self.path.name}: {self.architecture}, {self.layers} layers, {size:.0f} MiB ({types})"


class _Walk:
    """A cursor over the header's bytes; running off the end is a truncated file."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def take(self, fmt: str) -> Value:
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.at)
        except struct.error as error:
            raise ModelError(f"{self.path} is truncated: its header ends early (an interrupted download?)") from error
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = int(self.take("<Q"))
        if self.at + length > len(self.data):
            raise ModelError(f"{self.path} is truncated: its header ends early (an interrupted download?)")
        raw = bytes(self.data[self.at : self.at + length])
        self.at += length
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = int(self.take("<Q"))  # read before `at` is: `self.at += take()` would add to the old cursor
        self.at += length

    def value(self, kind: int) -> Value:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind not in _SCALARS:
            raise ModelError(f"{self.path} is not a GGUF file this reader knows (metadata value type {kind})")
        return self.take(_SCALARS[GGUFValueType(kind)])

    def array(self) -> int:
        """Skip an array, returning its length."""
        kind, length = int(self.take("<I")), int(self.take("<Q"))
        if kind == GGUFValueType.STRING:
            for _ in range(length):
                self.skip_string()
        elif kind == GGUFValueType.ARRAY:
            for _ in range(length):
                self.array()
        elif kind in _SCALARS:
            self.at += length * struct.calcsize(_SCALARS[GGUFValueType(kind)])
        else:
            raise ModelError(f"{self.path} is not a GGUF file this reader knows (array of value type {kind})")
        if self.at > len(self.data):
            raise ModelError(f"{self.path} is truncated: its header ends early (an interrupted download?)")
        return length


def _type_and_size(type_id: int, shape: tuple[int, ...]) -> tuple[str, int]:
    """gguf-py's name of a ggml type and the bytes a tensor of `shape` takes in it ("type N", 0 for an unknown id)."""
    try:
        kind = GGMLQuantizationType(type_id)
    except ValueError:
        return f"type {type_id}", 0
    block, block_bytes = GGML_QUANT_SIZES[kind]
    return kind.name, math.prod(shape) // block * block_bytes


def read_header(path: Path) -> GGUFHeader:
    """Parse `path`'s header (no tensor data is read). ModelError for a file that is not a GGUF or is cut short."""
    try:
        with path.open("rb") as file:
            size = path.stat().st_size
            if size < 24:
                raise ModelError(f"{path} is not a GGUF file ({size} bytes)")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(data, path, size)
    except OSError as error:
        raise ModelError(f"cannot read {path}: {error}") from error


def _parse(data: mmap.mmap, path: Path, size: int) -> GGUFHeader:
    if data[:4] != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    walk = _Walk(data, path)
    walk.at = 4
    version = int(walk.take("<I"))
    if version not in (2, 3):
        raise ModelError(f"{path} is GGUF version {version}; this reader knows versions 2 and 3")
    tensor_count, kv_count = int(walk.take("<Q")), int(walk.take("<Q"))
    metadata: dict[str, Value] = {}
    lengths: dict[str, int] = {}
    for _ in range(kv_count):
        key = walk.string()
        kind = int(walk.take("<I"))
        if kind == GGUFValueType.ARRAY:
            lengths[key] = walk.array()
        else:
            metadata[key] = walk.value(kind)
    infos = []
    for _ in range(tensor_count):
        name = walk.string()
        dims = int(walk.take("<I"))
        shape = tuple(int(walk.take("<Q")) for _ in range(dims))
        type_id, offset = int(walk.take("<I")), int(walk.take("<Q"))
        type_name, nbytes = _type_and_size(type_id, shape)
        infos.append(TensorInfo(name, type_name, nbytes, shape, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-walk.at // alignment) * alignment
    return GGUFHeader(path, size, data_start, metadata, lengths, tuple(infos))


def check_supported(header: GGUFHeader) -> None:
    """Refuse (ModelError, one line) a file this runtime cannot run: another architecture, a tensor type it does not
    read, a rope scaling or tokenizer it does not reproduce, or tensor data past the end of the file."""
    where = header.path
    if header.architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelError(f"{where}: architecture {header.architecture or '(none)'!r} is not supported "
                         f"({supported_line()})")
    unsupported = [t for t in header.tensors if t.type_name not in SUPPORTED_TYPES]
    if unsupported:
        kinds = sorted({t.type_name for t in unsupported})
        raise ModelError(f"{where}: {len(unsupported)} tensors are of types this runtime does not read "
                         f"({', '.join(kinds)}; first {unsupported[0].name}) ({supported_line()})")
    if header.data_end > header.file_size:
        raise ModelError(f"{where} is truncated: its tensors end at byte {header.data_end:,}, the file has "
                         f"{header.file_size:,} (an interrupted download?)")
    scaling, _ = header.rope_scaling
    if scaling not in SUPPORTED_ROPE_SCALINGS:
        raise ModelError(f"{where}: rope scaling {scaling!r} is not supported yet (only linear scaling and Llama 3's "
                         "frequency factors)")
    tokenizer = str(header.metadata.get("tokenizer.ggml.model", ""))
    if tokenizer not in SUPPORTED_TOKENIZERS or not header.vocab_size:
        raise ModelError(f"{where}: no tokenizer this runtime builds in its metadata (tokenizer.ggml.model "
                         f"{tokenizer or '(none)'!r}; supported: {', '.join(SUPPORTED_TOKENIZERS)})")
    for key in ("block_count", "embedding_length", "attention.head_count", "attention.layer_norm_rms_epsilon"):
        header.value(key)  # raises for a file that lacks it
