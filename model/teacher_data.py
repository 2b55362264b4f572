"""Training and evaluation prompts, and the teacher's own answers to them.

The diffusion model learns the teacher's answers (SmolLM2-135M-Instruct, greedy, voice-assistant system prompt), not
human chit-chat: training on human replies pulls the model away from its own voice (see DESIGN.md). Prompts are
questions and remarks people actually typed, from the MIT-licensed `chitchat-dataset` package; a fixed set of held-out
prompts (tests/data/heldout_prompts.txt) is never trained on.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

_WORDS = re.compile(r"[A-Za-z']+")


def chitchat_prompts(min_words: int = 4, max_words: int = 24) -> list[str]:
    """Distinct user messages from chitchat-dataset that read like something you would ask an assistant."""
    import chitchat_dataset

    data = chitchat_dataset.Dataset()
    seen: set[str] = set()
    prompts: list[str] = []
    for conversation in data.values():
        for turn in conversation["messages"]:
            text = " ".join(part["text"].strip() for part in turn).strip()
            words = _WORDS.findall(text)
            if not (min_words <= len(words) <= max_words) or "?" not in text:
                continue
            if any(ch in text for ch in "<>@#*_") or "http" in text:
                continue
            key = " ".join(w.lower() for w in words)
            if key in seen:
                continue
            seen.add(key)
            prompts.append(text)
    return prompts


def split_prompts(prompts: Sequence[str], heldout: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """A fixed shuffle, then the first `heldout` prompts are held out forever."""
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return order[heldout:], order[:heldout]


@dataclass(frozen=True, slots=True)
class TeacherExample:
    prompt: str
    prompt_ids: list[int]  # chat-templated prompt, ending with the assistant header
    answer_ids: list[int]  # teacher's greedy answer, ending with EOS when it finished


def chat_prompt_ids(tokenizer, system_prompt: str, user_text: str) -> list[int]:
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_text}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return list(encoded["input_ids"])


@torch.inference_mode()
def teacher_answers(
    model,
    tokenizer,
    prompts: Sequence[str],
    system_prompt: str,
    max_new_tokens: int = 64,
    batch_size: int = 32,
) -> Iterator[TeacherExample]:
    """Greedy answers of the autoregressive teacher, batched with left padding."""
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        encoded = [chat_prompt_ids(tokenizer, system_prompt, p) for p in batch]
        width = max(len(e) for e in encoded)
        ids = torch.full((len(batch), width), pad)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, width - len(e) :] = torch.tensor(e)
            attention[row, width - len(e) :] = 1
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
        )
        for row, prompt in enumerate(batch):
            answer = out[row, width:].tolist()
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            yield TeacherExample(prompt, encoded[row], answer)


def save_examples(path: Path, examples: Sequence[TeacherExample]) -> None:
    with path.open("w") as f:
        for ex in examples:
            f.write(json.dumps({"prompt": ex.prompt, "prompt_ids": ex.prompt_ids, "answer_ids": ex.answer_ids}) + "\n")


def load_examples(path: Path) -> list[TeacherExample]:
    examples = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            examples.append(TeacherExample(row["prompt"], row["prompt_ids"], row["answer_ids"]))
    return examples
