"""Local mode's device choice and stream counters, on a fake `sounddevice` (no PortAudio, no devices)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from voice.errors import NoAudioDevice
from voice.modes.audio_devices import check_devices, find_audio_device, supported_rates
from voice.modes.local import LocalAudioConfig, SpeakerBuffer, StreamCounters, heard_samples


class FakePortAudioError(Exception):
    pass


class FakeSoundDevice:
    """Two ALSA devices as PulseAudio shows them, and a USB microphone that only opens at 44.1 and 48 kHz."""

    PortAudioError = FakePortAudioError

    def __init__(self) -> None:
        self.devices = [
            {"name": "USB Mic: Audio (hw:1,0)", "max_input_channels": 1, "max_output_channels": 0,
             "rates": {44100, 48000}},
            {"name": "pulse", "max_input_channels": 32, "max_output_channels": 32, "rates": None},
            {"name": "default", "max_input_channels": 32, "max_output_channels": 32, "rates": None},
        ]

    def query_devices(self, index: int | None = None) -> Any:
        return self.devices if index is None else self.devices[index]

    def _check(self, device: int | None, samplerate: int, **_: Any) -> None:
        rates = self.devices[2 if device is None else device]["rates"]
        if rates is not None and samplerate not in rates:
            raise FakePortAudioError("Invalid sample rate [PaErrorCode -9997]")

    check_input_settings = _check
    check_output_settings = _check


def test_devices_are_chosen_by_index_exact_name_or_unique_part() -> None:
    sd = FakeSoundDevice()
    assert find_audio_device(sd, None, "input") is None
    assert find_audio_device(sd, 1, "input") == 1
    assert find_audio_device(sd, "pulse", "input") == 1
    assert find_audio_device(sd, "DEFAULT", "output") == 2
    assert find_audio_device(sd, "usb", "input") == 0


def test_an_unknown_or_ambiguous_name_lists_the_choices() -> None:
    sd = FakeSoundDevice()
    with pytest.raises(NoAudioDevice, match=r"no input device named 'headset'; .*0 'USB Mic.*1 'pulse', 2 'default'"):
        find_audio_device(sd, "headset", "input")
    with pytest.raises(NoAudioDevice, match=r"no output device named 'usb'; output devices here: 1 'pulse'"):
        find_audio_device(sd, "usb", "output")  # the USB device has no output channels
    with pytest.raises(NoAudioDevice, match="names several input devices"):
        find_audio_device(sd, "u", "input")
    with pytest.raises(NoAudioDevice, match="no output device with index 0"):
        find_audio_device(sd, 0, "output")


def test_a_device_that_cannot_open_at_16_khz_says_which_rates_it_offers() -> None:
    sd = FakeSoundDevice()
    assert supported_rates(sd, 0, "input") == [44100, 48000]
    with pytest.raises(NoAudioDevice, match=r"cannot be the microphone at 16000 Hz .*it opens at 44100 Hz, 48000 Hz"):
        check_devices(sd, LocalAudioConfig(input_device="USB"), output_rate=22050)
    chosen = check_devices(sd, LocalAudioConfig(input_device="pulse", output_device=2), output_rate=22050)
    assert (chosen.input, chosen.output) == (1, 2)


def test_no_devices_at_all_points_to_the_browser() -> None:
    sd = FakeSoundDevice()
    sd.devices = []
    with pytest.raises(NoAudioDevice, match="voice-assistant serve"):
        check_devices(sd, LocalAudioConfig())


def status(**flags: bool) -> SimpleNamespace:
    return SimpleNamespace(output_underflow=flags.get("out_under", False),
                           input_overflow=flags.get("in_over", False), input_underflow=False)  # fmt: skip


def test_counters_report_each_turns_flags_and_longest_callback_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("voice.modes.local.boost_audio_thread", lambda: None)
    counters = StreamCounters()
    counters.on_output(status(), 10.00, sounding=False)
    counters.on_output(status(out_under=True), 10.25, sounding=False)  # silence ran dry: nobody hears it
    counters.on_output(status(out_under=True), 10.27, sounding=True)
    counters.on_input(status(in_over=True))
    first = counters.since_last_report()
    assert first["output_underflows"] == 2 and first["audible_underflows"] == 1 and first["input_overflows"] == 1
    assert first["output_callback_gap_ms"] == pytest.approx(250)
    counters.on_output(status(), 10.29, sounding=True)
    second = counters.since_last_report()
    assert second["output_underflows"] == 0 and second["audible_underflows"] == 0 and second["input_overflows"] == 0
    assert second["output_callback_gap_ms"] == pytest.approx(20)


def test_heard_samples_leave_out_what_is_still_queued_in_the_device() -> None:
    assert heard_samples(22050, 0.1, 22050) == 22050 - 2205
    assert heard_samples(1000, 0.1, 22050) == 0


def test_speaker_buffer_pads_with_silence_and_counts_what_it_handed_over() -> None:
    buffer = SpeakerBuffer()
    buffer.push(b"\x01\x00\x02\x00")
    out = bytearray(8)
    buffer.fill(memoryview(out), now=1.0)
    assert bytes(out) == b"\x01\x00\x02\x00" + bytes(4)
    assert buffer.played == 2
    assert buffer.busy(1.1) and not buffer.busy(2.0)
    assert buffer.sounding(1.1, device_latency_s=0.15) and not buffer.sounding(1.2, device_latency_s=0.15)


def test_a_paused_speaker_plays_silence_and_keeps_the_speech_for_later() -> None:
    buffer = SpeakerBuffer()
    buffer.push(b"\x01\x00\x02\x00")
    buffer.pause(True)  # a cough: maybe a barge-in
    out = bytearray(4)
    buffer.fill(memoryview(out), now=1.0)
    assert bytes(out) == bytes(4) and buffer.played == 0
    buffer.pause(False)  # no words came
    buffer.fill(memoryview(out), now=1.1)
    assert bytes(out) == b"\x01\x00\x02\x00" and buffer.played == 2


def test_output_latency_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="5-2000 ms, got 0 ms"):
        LocalAudioConfig(output_latency_s=0.0)


def test_alsa_messages_go_to_the_log_not_the_console(capfd: pytest.CaptureFixture[str]) -> None:
    import ctypes
    import ctypes.util

    from voice.modes import audio_devices

    if not audio_devices.quiet_alsa():
        pytest.skip("no ALSA library on this machine")
    alsa = ctypes.CDLL(ctypes.util.find_library("asound"))
    before = audio_devices.alsa_messages
    handle = ctypes.c_void_p()
    # an unknown PCM name: ALSA reports "Unknown PCM no-such-device" through its error handler
    assert alsa.snd_pcm_open(ctypes.byref(handle), b"no-such-device", 0, 0) < 0
    assert audio_devices.alsa_messages > before
    assert "ALSA lib" not in capfd.readouterr().err


def test_a_speaker_block_says_what_a_playback_report_needs_and_a_stop_makes_older_reports_stale() -> None:
    buffer = SpeakerBuffer()
    buffer.new_answer(3)
    buffer.push(b"\x01\x00" * 6)
    out = bytearray(8)
    turn, generation, before, count = buffer.fill(memoryview(out), now=1.0)
    assert (turn, before, count) == (3, 0, 4)
    assert buffer.fill(memoryview(out), now=1.1)[2:] == (4, 2)  # the rest, padded: 2 samples of the answer
    assert buffer.fill(memoryview(out), now=1.2)[3] == 0  # silence reports nothing played
    buffer.pause(True)
    assert buffer.generation != generation  # a report sent before the pause is recognised as stale


def test_headset_and_half_duplex_exclude_each_other_and_open_speakers_cancel_by_default() -> None:
    assert LocalAudioConfig().cancels_echo
    assert not LocalAudioConfig(headset=True).cancels_echo and not LocalAudioConfig(half_duplex=True).cancels_echo
    with pytest.raises(ValueError, match="choose one"):
        LocalAudioConfig(headset=True, half_duplex=True)
