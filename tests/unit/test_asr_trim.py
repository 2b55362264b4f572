"""Where a long turn's Whisper buffer may be cut: only between whole committed words (no model needed)."""

from __future__ import annotations

import itertools

from voice.listen.local_agreement import Word
from voice.listen.transcriber import whole_word_boundaries


def words(*spec: tuple[str, float, float]) -> list[Word]:
    return [Word(text, start, end) for text, start, end in spec]


def test_cuts_fall_after_committed_words_that_a_new_word_follows() -> None:
    committed = words((" He", 0.0, 0.2), (" was", 0.2, 0.5), (" cold", 0.5, 0.9))
    tentative = words((" and", 0.9, 1.1))
    assert whole_word_boundaries(committed, tentative) == [0.2, 0.5, 0.9]


def test_no_cut_inside_a_word_whisper_split_in_pieces() -> None:
    committed = words((" rather", 0.0, 0.4), (" cold", 0.4, 0.8))
    assert whole_word_boundaries(committed, words(("-hearted", 0.8, 1.2))) == [0.4]  # not between cold|-hearted
    assert whole_word_boundaries(words((" old", 0.0, 0.3), ("-sposed", 0.3, 0.7)), []) == [0.7]


def test_the_committed_end_is_a_cut_when_nothing_tentative_follows() -> None:
    assert whole_word_boundaries(words((" yes", 0.0, 0.3)), []) == [0.3]


class _Segment:
    def __init__(self, words: list[Word]) -> None:
        self.words = [_W(w.text, w.start, w.end) for w in words]
        self.text = "".join(w.text for w in words)
        self.start = words[0].start if words else 0.0
        self.end = words[-1].end if words else 0.0


class _W:
    def __init__(self, word: str, start: float, end: float) -> None:
        self.word, self.start, self.end = word, start, end


class ScriptedWhisper:
    """Answers each decode with `hypothesis(buffer_seconds, decode_number)`; word times are buffer-relative."""

    def __init__(self, hypothesis) -> None:
        self.hypothesis = hypothesis
        self.decodes = 0
        self.longest_s = 0.0

    def transcribe(self, audio, **_options):
        self.decodes += 1
        seconds = audio.size / 16000
        self.longest_s = max(self.longest_s, seconds)
        return [_Segment(self.hypothesis(seconds, self.decodes))], None


def test_the_whisper_buffer_never_passes_30_s_when_nothing_is_ever_committed() -> None:
    import numpy as np

    from voice.listen.transcriber import StreamingTranscriber, TranscriberConfig

    def never_agrees(seconds: float, n: int) -> list[Word]:  # a different word every decode: nothing commits
        return [Word(f" noise{n}x{i}", i * 0.5, i * 0.5 + 0.4) for i in range(int(seconds * 2))]

    model = ScriptedWhisper(never_agrees)
    transcriber = StreamingTranscriber(model, TranscriberConfig())
    for _ in range(90):  # 45 s of audio, in half-second steps
        transcriber.insert_audio(np.zeros(8000, dtype=np.float32))
        transcriber.process(force=True)
        assert transcriber.buffer_s <= 25.0
    assert model.longest_s < 30.0


def test_finish_never_doubles_a_first_word_committed_in_an_untrimmed_buffer() -> None:
    import numpy as np

    from voice.listen.transcriber import StreamingTranscriber

    def steady(seconds: float, n: int) -> list[Word]:
        return [Word(" Hi", 0.0, 0.04), Word(" there", 0.3, 0.6)]

    transcriber = StreamingTranscriber(ScriptedWhisper(steady))
    for _ in range(3):
        transcriber.insert_audio(np.zeros(8000, dtype=np.float32))
        transcriber.process(force=True)
    assert transcriber.finish().text == "Hi there"


def test_spread_words_keeps_whispers_spacing_and_covers_the_segment() -> None:
    from voice.listen.transcriber import spread_words

    timed = spread_words(" Hello there, friend.", 1.0, 2.5)
    assert [w.word for w in timed] == [" Hello", " there,", " friend."]
    assert (timed[0].start, timed[-1].end) == (1.0, 2.5)
    assert all(a.end == b.start for a, b in itertools.pairwise(timed))


class TimingWhisper(ScriptedWhisper):
    """Also records whether each decode asked for word timestamps."""

    def __init__(self, hypothesis) -> None:
        super().__init__(hypothesis)
        self.word_times: list[bool] = []

    def transcribe(self, audio, **options):
        self.word_times.append(options["word_timestamps"])
        return super().transcribe(audio, **options)


def test_the_likely_final_skips_word_alignment_and_is_the_final_when_no_audio_follows() -> None:
    import numpy as np

    from voice.listen.transcriber import StreamingTranscriber

    def growing(seconds: float, n: int) -> list[Word]:
        return [Word(f" w{i}", i * 0.5, i * 0.5 + 0.4) for i in range(int(seconds * 2))]

    model = TimingWhisper(growing)
    transcriber = StreamingTranscriber(model)
    for _ in range(3):
        transcriber.insert_audio(np.zeros(8000, dtype=np.float32))
        transcriber.process(force=True)
    committed = transcriber.process(force=True)  # nothing new: no decode
    assert committed is None
    transcriber.insert_audio(np.zeros(8000, dtype=np.float32))
    likely = transcriber.process(force=True, as_final=True)
    assert likely is not None and likely.text == "w0 w1 w2 w3"  # two seconds of audio
    final = transcriber.finish()
    assert final.text == likely.text
    assert model.word_times == [True, True, True, False]  # partials aligned words; the final decoded once, without


def test_a_decode_that_is_one_sentence_said_twice_keeps_it_once() -> None:
    from voice.listen.transcriber import drop_repeated_sentence

    def spoken(text: str) -> list[Word]:
        return [Word(f" {w}", i * 0.3, i * 0.3 + 0.2) for i, w in enumerate(text.split())]

    assert [w.text for w in drop_repeated_sentence(spoken("10 of close. 10 of close."))] == [" 10", " of", " close."]
    assert len(drop_repeated_sentence(spoken("Hi. Hi. Hi."))) == 1
    cut_shorts = ("8 of spades 4 of close 7 of hearts. 8 of spades 4 of close", "Thank you for your patience. Thank")
    for cut_short in cut_shorts:
        assert drop_repeated_sentence(spoken(cut_short)) == spoken(cut_short.split(". ")[0] + "."), cut_short
    for kept in ("5, 5, 5, 5,", "Ten of clubs. Seven of clubs.", "no no no", "I said it. I said it again.",
                 "Yes. Yes, please.", "Stop."):
        assert drop_repeated_sentence(spoken(kept)) == spoken(kept), kept


def test_a_decode_that_loops_is_told_from_one_that_repeats_a_word_once() -> None:
    from voice.listen.transcriber import repeat_themselves

    def spoken(text: str) -> list[Word]:
        return [Word(f" {w}", i * 0.3, i * 0.3 + 0.2) for i, w in enumerate(text.split())]

    for loop in ("F F F", "Press 1-4 Press 1-4 Press 1", "minute, minute, minute, minute", "Press Press",
                 "Press 1 to enter a number number number"):
        assert repeat_themselves(spoken(loop)), loop
    for words_ in ("Folder 9.", "Press star to cancel.", "eight of spades four of clubs seven of hearts", "no",
                   "that that is", "Please press 1 to mute or unmute yourself, 2 to lock or unlock the conference."):
        assert not repeat_themselves(spoken(words_)), words_


class WindowedWhisper(ScriptedWhisper):
    """A model whose encoder window can be cut (`encoder_frames`), as `windowed_model_class` makes: it loops on any
    window shorter than 8 s of frames beyond the audio, and hears the words on a wider one."""

    encoder_frames: int | None = None

    def __init__(self) -> None:
        super().__init__(self._hear)
        self.windows: list[int | None] = []

    def transcribe(self, audio, **options):
        self.windows.append(self.encoder_frames)
        return super().transcribe(audio, **options)

    def _hear(self, seconds: float, n: int) -> list[Word]:
        if self.encoder_frames is not None and self.encoder_frames < (seconds + 8) * 100:
            return [Word(" F", 0.0, 0.2), Word(" F", 0.3, 0.5), Word(" F", 0.6, 0.8)]
        return [Word(" Folder", 0.0, 0.4), Word(" 9.", 0.5, 0.9)]


def test_a_final_that_loops_is_decoded_again_on_a_wider_window_and_a_partial_is_not() -> None:
    import numpy as np

    from voice.listen.transcriber import StreamingTranscriber, TranscriberConfig

    model = WindowedWhisper()
    transcriber = StreamingTranscriber(model, TranscriberConfig(final_margin_s=5.0))
    transcriber.insert_audio(np.zeros(16000, dtype=np.float32))
    partial = transcriber.process(force=True)
    assert partial is not None and partial.text == "F F F" and model.decodes == 1  # partials: no second decode
    transcriber.insert_audio(np.zeros(8000, dtype=np.float32))
    likely = transcriber.process(force=True, as_final=True)
    assert likely is not None and likely.text == "Folder 9."
    assert model.windows[1:] == [700, 1000]  # 1.5 s + 5 s, then + 8 s, in whole seconds
    assert transcriber.finish().text == "Folder 9." and model.decodes == 3  # the final reuses that decode
    never = StreamingTranscriber(WindowedWhisper(), TranscriberConfig(final_margin_s=5.0, recheck_margins_s=()))
    never.insert_audio(np.zeros(16000, dtype=np.float32))
    assert never.finish().text == "F F F"


class DroppingWhisper(WindowedWhisper):
    """Hears the words on a partial's window (5 s) and on the full one, nothing in between (faster-whisper's
    no-speech rule dropped the segment); `silent` hears nothing on any window (a cough)."""

    def __init__(self, silent: bool = False) -> None:
        super().__init__()
        self.silent = silent

    def _hear(self, seconds: float, n: int) -> list[Word]:
        frames = self.encoder_frames
        if self.silent or (frames is not None and frames > 500):
            return []
        return [Word(" Folder", 0.0, 0.4), Word(" 9.", 0.5, 0.9)]


def test_a_final_that_hears_nothing_is_decoded_again_on_wider_windows_if_a_partial_heard_words() -> None:
    import numpy as np

    from voice.listen.transcriber import StreamingTranscriber, TranscriberConfig

    cases = ((False, True, "Folder 9.", [500, 700, 1000, None]), (True, True, "", [500, 700]),
             (False, False, "", [700]))
    for silent, partial, text, windows in cases:
        model = DroppingWhisper(silent)
        transcriber = StreamingTranscriber(model, TranscriberConfig(final_margin_s=5.0))
        transcriber.insert_audio(np.zeros(16000, dtype=np.float32))
        if partial:
            transcriber.process(force=True)
        transcriber.insert_audio(np.zeros(8000, dtype=np.float32))
        assert transcriber.finish().text == text
        assert model.windows == windows, (silent, partial)
