"""Training and evaluation prompts, and the teacher's own answers to them.

The diffusion model learns the teacher's answers (SmolLM2-135M-Instruct, greedy, voice-assistant system prompt), not
human chit-chat: training on human replies pulls the model away from its own voice (in the first CPU probe of this
adaptation, the adapted model's next-token agreement with the teacher's greedy answers fell from 0.98 to 0.82 after
training on human replies; model/bundled/default/MODEL_CARD.md, "Training", describes the data used instead). Prompts
are questions and remarks people actually typed, from the MIT-licensed `chitchat-dataset` package; a fixed set of
held-out prompts (tests/data/heldout_prompts.txt) is never trained on.
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


Exchange = tuple[str, str]  # (user text, assistant answer): one earlier exchange a prompt may carry


@dataclass(frozen=True, slots=True)
class TeacherExample:
    prompt: str
    prompt_ids: list[int]  # chat-templated prompt, ending with the assistant header
    answer_ids: list[int]  # teacher's greedy answer, ending with EOS when it finished
    history: Exchange | None = None  # the earlier exchange inside `prompt_ids`, if any


def chat_prompt_ids(tokenizer, system_prompt: str, user_text: str, history: Exchange | None = None) -> list[int]:
    """The prompt as the assistant sends it: system prompt, the earlier exchange (a voice session shows the model one,
    voice/think/dialogue.py), the user's message, the assistant header."""
    earlier = [] if history is None else [
        {"role": "user", "content": history[0]}, {"role": "assistant", "content": history[1]}
    ]
    messages = [{"role": "system", "content": system_prompt}, *earlier, {"role": "user", "content": user_text}]
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
    histories: Sequence[Exchange | None] | None = None,
) -> Iterator[TeacherExample]:
    """Greedy answers of the autoregressive teacher, batched with left padding; `histories[i]` is the earlier
    exchange prompt i follows (None or absent: a first turn)."""
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    earlier = list(histories) if histories is not None else [None] * len(prompts)
    if len(earlier) != len(prompts):
        raise ValueError("histories needs one entry per prompt")
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        history = earlier[start : start + batch_size]
        encoded = [chat_prompt_ids(tokenizer, system_prompt, p, h) for p, h in zip(batch, history, strict=True)]
        width = max(len(e) for e in encoded)
        ids = torch.full((len(batch), width), pad)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, width - len(e) :] = torch.tensor(e)
            attention[row, width - len(e) :] = 1
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=attention.to(model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
        )
        for row, prompt in enumerate(batch):
            answer = out[row, width:].tolist()
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            yield TeacherExample(prompt, encoded[row], answer, history[row])


def example_row(ex: TeacherExample) -> dict[str, object]:
    """One line of a teacher.jsonl file."""
    row: dict[str, object] = {"prompt": ex.prompt, "prompt_ids": ex.prompt_ids, "answer_ids": ex.answer_ids}
    if ex.history is not None:
        row["history"] = list(ex.history)
    return row


def load_examples(path: Path) -> list[TeacherExample]:
    examples = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            history = tuple(row["history"]) if row.get("history") else None
            examples.append(TeacherExample(row["prompt"], row["prompt_ids"], row["answer_ids"], history))
    return examples


# Assistant-style questions for the teacher to answer, beside chit-chat: a voice assistant mostly hears requests. Made
# from templates so they are many and varied; none is one of the reports' or the soak's questions, and the held-out
# evaluation prompts (tests/data/heldout_prompts.txt) are chit-chat, never these.
_THINGS = (
    "the Eiffel Tower", "a black hole", "photosynthesis", "the Great Wall of China", "a volcano", "the internet",
    "gravity", "a rainbow", "the Amazon rainforest", "a hurricane", "DNA", "Mars", "a leap year", "the Olympic Games",
    "jazz music", "a vaccine", "an earthquake", "the Sahara desert", "a solar eclipse", "electricity", "coffee",
    "chocolate", "the stock market", "yoga", "a haiku", "the Pacific Ocean", "a glacier", "the human heart",
    "a penguin", "an elephant", "a dolphin", "the Mona Lisa", "Shakespeare", "the piano", "a marathon", "a submarine",
    "a satellite", "the ozone layer", "sourdough bread", "cheese", "the violin", "chess", "a kangaroo", "the brain",
    "a tornado", "the Nile", "a comet", "a robot", "the Moon landing", "tea",
)
_THING_TEMPLATES = (
    "What is {}?", "Tell me about {}.", "Give me a fun fact about {}.", "Can you explain {} in one sentence?",
    "Why do people find {} interesting?", "What do you know about {}?",
)
_TASKS = (
    "bake bread", "tie a tie", "fall asleep faster", "learn to code", "save money", "make pancakes", "start running",
    "grow tomatoes", "write a good email", "clean my keyboard", "remember names", "stay focused", "cook rice",
    "change a flat tire", "learn the guitar", "reduce stress", "make new friends", "speak in public",
    "pack for a trip", "drink more water", "study for an exam", "paint a room", "fix a squeaky door", "meditate",
    "take better photos", "wake up early", "make a budget", "bake cookies", "stop procrastinating", "iron a shirt",
)
_TASK_TEMPLATES = (
    "How do I {}?", "What is the best way to {}?", "Can you give me a tip to {}?", "Is it hard to {}?",
    "How long does it take to {}?",
)
_WANTS = (
    "a movie", "a podcast", "a song for the morning", "a board game", "a new hobby", "a dessert", "a name for my dog",
    "a place to travel in summer", "a healthy lunch", "a short workout", "a gift for my friend", "a video game",
    "something to do on a rainy day", "a drink for a hot day",
)
_WANT_TEMPLATES = ("Can you recommend {}?", "Suggest {}, please.", "Do you have an idea for {}?")
_REQUESTS = (
    "What time is it?", "What's the weather like today?", "Set a timer for ten minutes.", "What day is it today?",
    "Can you help me?", "Who are you?", "What can you do?", "Are you a robot?", "Tell me a story.",
    "Sing me a song.", "I'm bored.", "I feel tired today.", "I had a great day!", "What should I do this weekend?",
    "Do you like music?", "What's your favorite color?", "Good night!", "How are you doing?", "Hi there!",
    "Thanks a lot!", "Can you say that again?", "What do you mean?", "That's funny.", "I don't understand.",
    "Remind me to call my mom.", "What is two plus two?", "How many days are in a year?", "Tell me a riddle.",
    "What's the news today?", "Play some music.",
)


def assistant_questions() -> list[str]:
    """Requests and questions of the kind people ask a voice assistant (about 520), in a fixed order."""
    questions = [t.format(x) for x in _THINGS for t in _THING_TEMPLATES]
    questions += [t.format(x) for x in _TASKS for t in _TASK_TEMPLATES]
    questions += [t.format(x) for x in _WANTS for t in _WANT_TEMPLATES]
    questions += list(_REQUESTS)
    return questions
