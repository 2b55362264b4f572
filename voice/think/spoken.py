"""What a spoken answer must be: the voice pipeline's system prompt and its logit rules, sent with every request.

They belong to the pipeline, not to the model: the same model behind `dlm-serve` answers an API client as it asks
(its own system message, its `max_tokens`), while a listener needs an answer that is short, never loops and ends soon
after a sentence. The pipeline passes them per request, to the local model or to any OpenAI-compatible endpoint.
"""

from __future__ import annotations

from model.chat import AnswerRules, GenerationOptions

# The prompt the bundled adapter's teacher answered its training prompts under (scripts/train/train_default_model.py):
# the adapter drafts answers of this style best, so the pipeline asks for them.
SPOKEN_SYSTEM_PROMPT = "You are a helpful voice assistant. Reply briefly, in one short sentence."

# Spoken answers never loop: no word 3-gram twice (as a listener hears it), no run of 6 tokens (punctuation counted)
# copied from the prompt, i.e. from an earlier answer or the system prompt, no answer opening with the previous one's
# first 2 tokens ("A: ..." five times in a row), and an end at the first sentence end after 24 tokens.
SPOKEN_RULES = AnswerRules(no_repeat_ngram=3, end_after=24, no_copy_ngram=6, no_copy_opening=2)

# The answer's first tokens are drafted whatever the model's draft policy judges of tokens per ms, where draft rows are
# nearly free (model/decoding/draft_policy.py, LEAD_MAX_SHAPE): the first phrase (three words,
# voice/speak/speculator.py) is rendered from those drafts while its words are verified and the end of turn is
# confirmed, so they buy time to first audio. Six tokens cover three words and the space that closes them.
SPOKEN_DRAFT_LEAD = 6



def spoken_answer(max_new_tokens: int = 64, system_prompt: str | None = None) -> GenerationOptions:
    """A spoken answer's options: the prompt (`system_prompt` in its place when given: `--system-prompt`) and the
    rules above, `max_new_tokens` at most (`--max-new-tokens`)."""
    return GenerationOptions(max_new_tokens=max_new_tokens, system_prompt=system_prompt or SPOKEN_SYSTEM_PROMPT,
                             rules=SPOKEN_RULES, draft_lead=SPOKEN_DRAFT_LEAD)
