"""Tiny randomly initialised checkpoints written to a temp folder, so adapters and loaders run on real files offline.

The unit tests build their models here, and so do the scripts that measure the server rather than a model
(`bench_api.py --model tiny`): scripts/ must not import tests/, and tests already import scripts/report_lib.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import BertConfig, BertForMaskedLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = [
    *("hello", "hi", "there", "how", "are", "you", "i", "am", "fine", "thanks", "good", "day"),
    *("what", "is", "your", "name", "the", "a", "cat", "dog", "sun"),
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<eos>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} [SEP] {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def word_tokenizer(with_mask: bool = True) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a few dozen words, with a chat template and an <eos>."""
    specials = SPECIALS if with_mask else [token for token in SPECIALS if token != "[MASK]"]
    vocab = {token: index for index, token in enumerate([*specials, *WORDS, "user", "assistant", "system", ":"])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        eos_token="<eos>",
        mask_token="[MASK]" if with_mask else None,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_bert(folder: Path, with_mask: bool = True, seed: int = 0) -> Path:
    """Save a 2-layer BERT masked LM and its tokenizer into `folder`."""
    torch.manual_seed(seed)
    tokenizer = word_tokenizer(with_mask)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
    )
    BertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


REMOTE_CODE = textwrap.dedent(
    '''
    """A LLaDA-shaped toy: a bidirectional encoder returning logits over input_ids; config carries mask_token_id."""
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import MaskedLMOutput


    class TinyDLMConfig(PretrainedConfig):
        model_type = "tiny_dlm"

        def __init__(self, vocab_size=40, hidden_size=32, max_position_embeddings=256, mask_token_id=4, **kwargs):
            self.vocab_size = vocab_size
            self.hidden_size = hidden_size
            self.max_position_embeddings = max_position_embeddings
            self.mask_token_id = mask_token_id
            super().__init__(**kwargs)


    class TinyDLMModel(PreTrainedModel):
        config_class = TinyDLMConfig

        def __init__(self, config):
            super().__init__(config)
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
            layer = nn.TransformerEncoderLayer(config.hidden_size, 2, 64, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(config.hidden_size, config.vocab_size)
            self.post_init()

        def forward(self, input_ids, **kwargs):
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            hidden = self.encoder(self.embed(input_ids) + self.position(positions))
            return MaskedLMOutput(logits=self.head(hidden))
    '''
)


def tiny_remote_code(folder: Path, seed: int = 0) -> Path:
    """Write the toy's code, an `auto_map` config, random weights and a tokenizer into `folder`."""
    import importlib.util

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "modeling_tiny_dlm.py").write_text(REMOTE_CODE)
    spec = importlib.util.spec_from_file_location("modeling_tiny_dlm_for_test", folder / "modeling_tiny_dlm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tokenizer = word_tokenizer()
    torch.manual_seed(seed)
    config = module.TinyDLMConfig(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
    model = module.TinyDLMModel(config)
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, folder / "model.safetensors")
    data = config.to_dict()
    data["auto_map"] = {
        "AutoConfig": "modeling_tiny_dlm.TinyDLMConfig",
        "AutoModel": "modeling_tiny_dlm.TinyDLMModel",
    }
    data["eos_token_id"] = tokenizer.eos_token_id
    (folder / "config.json").write_text(json.dumps(data))
    tokenizer.save_pretrained(folder)
    return folder


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per UTF-8 byte, so "é" is two tokens, like byte-level BPE on rare characters. No chat template."""
    from tokenizers import decoders

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


BYTE_EOS, BYTE_MASK = 256, 257  # just past the byte tokenizer's 256 ids


class ScriptedDenoiser:
    """A `Denoiser` that writes a fixed answer: the planned token of each position, with confidence `strength`.

    With `eos_ahead`, a masked position whose left neighbour is still masked guesses end-of-sequence instead, as a
    model unsure of what follows does: every draft then ends in an end-of-sequence guess.
    """

    block_causal = True

    def __init__(self, plan: list[int], eos_ahead: bool = False, strength: float = 9.0) -> None:
        self.plan = plan
        self.eos_ahead = eos_ahead
        self.strength = strength
        self.mask_id = BYTE_MASK
        self.eos_ids = frozenset({BYTE_EOS})
        self.vocab_size = BYTE_MASK + 1
        self.prompts: list[list[int]] = []

    def start(self, prompt_ids: list[int], max_new_tokens: int, use_cache: bool) -> None:
        self.prompts.append(list(prompt_ids))

    def block_logits(self, canvas: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        logits = torch.zeros(hi - lo, self.vocab_size)
        for j in range(lo, hi):
            unsure = self.eos_ahead and j > 0 and int(canvas[j - 1]) == self.mask_id
            token = BYTE_EOS if unsure or j >= len(self.plan) else self.plan[j]
            logits[j - lo, token] = self.strength
        logits[:, self.mask_id] = -torch.inf
        return logits

    def finish_block(self, canvas: torch.Tensor, lo: int, hi: int) -> None:
        pass


def scripted_byte_model(
    answer: str, block_length: int = 4, eos_ahead: bool = False, context_length: int | None = None,
    steps_per_block: int | None = None,
):  # -> DiffusionChatModel (imported lazily: this module must stay cheap to import)
    """A `DiffusionChatModel` over the byte tokenizer that answers `answer` (then EOS) to anything, committing one
    token per pass from left to right (unless `steps_per_block` is smaller), so every block end and every character
    boundary shows up in some draft."""
    from model.adapters.sampler_backend import SamplerBackend
    from model.chat.engine import DiffusionChatModel
    from model.decoding.sampler import SamplerConfig

    tokenizer = byte_tokenizer()
    denoiser = ScriptedDenoiser(list(tokenizer.encode(answer)), eos_ahead)
    steps = steps_per_block or block_length
    config = SamplerConfig(block_length=block_length, steps_per_block=steps, remasking="left_to_right")
    backend = SamplerBackend("scripted", denoiser, config)
    return DiffusionChatModel("scripted", tokenizer, backend, config, context_length=context_length)


LLAMA_VOCAB = 48
LLAMA_EOS = 2


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A random two-layer Llama (the architecture of SmolLM2) with a 48-token vocabulary and EOS 2."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=LLAMA_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=LLAMA_EOS,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def smollm2_shaped_llama(device: torch.device | str = "cpu", seed: int = 0) -> LlamaForCausalLM:
    """A random Llama of SmolLM2-135M-Instruct's exact shape (the bundled model's base), built where it runs: what a
    pass of the bundled model costs, measured without its weights (scripts/bench/bench_lm.py --model tiny,
    scripts/device_check.py on a machine that lacks them)."""
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: no 540 MB fp32 copy on the host first
        return LlamaForCausalLM(config).eval()
