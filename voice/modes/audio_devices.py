"""The sound devices of local mode (voice/modes/local.py): PortAudio's list, a device named by index or by name,
the rates it opens at, and a check before the models load that says what to do when they do not fit; ALSA's console
messages sent to the log.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from voice.audio import TARGET_RATE
from voice.errors import NoAudioDevice

log = logging.getLogger(__name__)

COMMON_RATES = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000, 88200, 96000)


class DeviceChoice(Protocol):
    """The devices a user named (`--input-device`, `--output-device`; None: the default), as LocalAudioConfig holds
    them."""

    input_device: int | str | None
    output_device: int | str | None


# --- ALSA's console messages ----------------------------------------------------------------------------------------
# ALSA prints its errors (e.g. "ALSA lib pcm.c:8570:(snd_pcm_recover) underrun occurred") straight to stderr. A handler
# installed before PortAudio starts sends them to the log instead; the underruns themselves are counted from
# PortAudio's callback flags. ctypes cannot declare a variadic callback, but the fixed leading arguments are passed
# the same way, so a handler that ignores the format arguments is safe.
_ALSA_HANDLER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                                      ctypes.c_char_p)  # fmt: skip
alsa_messages = 0


def _on_alsa_error(file: bytes | None, line: int, function: bytes | None, err: int, fmt: bytes | None) -> None:
    global alsa_messages
    alsa_messages += 1
    log.debug("ALSA %s:%d (%s) %s", (file or b"").decode(errors="replace"), line,
              (function or b"").decode(errors="replace"), (fmt or b"").decode(errors="replace"))  # fmt: skip


_alsa_handler = _ALSA_HANDLER_TYPE(_on_alsa_error)  # kept alive for the life of the process


def quiet_alsa() -> bool:
    """Route ALSA's error messages to the log; False where there is no ALSA (macOS, Windows)."""
    name = ctypes.util.find_library("asound")
    if name is None:
        return False
    try:
        alsa = ctypes.CDLL(name)
    except OSError:
        return False
    alsa.snd_lib_error_set_handler(_alsa_handler)
    return True


def sounddevice_module() -> Any:
    quiet_alsa()  # before `import sounddevice`: initialising PortAudio already probes ALSA devices
    try:
        import sounddevice
    except OSError as err:  # the Python package imports PortAudio, a system library
        raise NoAudioDevice(f"the PortAudio library is missing ({err}); `make install` installs libportaudio2") from err
    return sounddevice


# --- devices --------------------------------------------------------------------------------------------------------
def _devices(sd: Any) -> list[dict[str, Any]]:
    return [dict(device, index=index) for index, device in enumerate(sd.query_devices())]


def list_devices() -> str:
    """Every device PortAudio sees: index, name, host API, channels, default rate; `>`/`<` mark the defaults."""
    sd = sounddevice_module()
    devices = _devices(sd)
    if not devices:
        return "no audio devices found"
    apis = [api["name"] for api in sd.query_hostapis()]
    default_in, default_out = (sd.default.device[0], sd.default.device[1])
    lines = []
    for device in devices:
        marks = (">" if device["index"] == default_in else " ") + ("<" if device["index"] == default_out else " ")
        lines.append(
            f"{marks} {device['index']:3d} {device['name']} ({apis[device['hostapi']]}): "
            f"{device['max_input_channels']} in, {device['max_output_channels']} out, "
            f"{device['default_samplerate']:.0f} Hz"
        )
    lines.append("> default microphone, < default speaker; choose with --input-device/--output-device NAME or INDEX")
    return "\n".join(lines)


def find_audio_device(sd: Any, spec: int | str | None, kind: str) -> int | None:
    """The index of the device `spec` names (an index, an exact name, or a unique part of a name), or None for the
    default. Raises `NoAudioDevice` with the devices of that kind when nothing or more than one device matches."""
    if spec is None:
        return None
    channels = "max_input_channels" if kind == "input" else "max_output_channels"
    usable = [device for device in _devices(sd) if device[channels] > 0]
    choices = ", ".join(f"{device['index']} {device['name']!r}" for device in usable) or "none"
    if isinstance(spec, int):
        if any(device["index"] == spec for device in usable):
            return spec
        raise NoAudioDevice(f"no {kind} device with index {spec}; {kind} devices here: {choices}")
    exact = [device for device in usable if device["name"].lower() == spec.lower()]
    partial = [device for device in usable if spec.lower() in device["name"].lower()]
    matches = exact or partial
    if len(matches) == 1:
        return int(matches[0]["index"])
    if not matches:
        raise NoAudioDevice(f"no {kind} device named {spec!r}; {kind} devices here: {choices}")
    names = ", ".join(f"{device['index']} {device['name']!r}" for device in matches)
    raise NoAudioDevice(f"{spec!r} names several {kind} devices ({names}); use the index or the whole name")


def supported_rates(sd: Any, device: int | None, kind: str) -> list[int]:
    """The common sample rates the device opens at (mono PCM16)."""
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    rates = []
    for rate in COMMON_RATES:
        try:
            check(device=device, channels=1, dtype="int16", samplerate=rate)
        except (sd.PortAudioError, ValueError):
            continue
        rates.append(rate)
    return rates


def _check_rate(sd: Any, device: int | None, kind: str, rate: int) -> None:
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    try:
        check(device=device, channels=1, dtype="int16", samplerate=rate)
    except (sd.PortAudioError, ValueError) as err:
        offered = supported_rates(sd, device, kind)
        name = "the default device" if device is None else f"device {device} {sd.query_devices(device)['name']!r}"
        what = "microphone" if kind == "input" else "speaker"
        offers = f"it opens at {', '.join(f'{r} Hz' for r in offered)}" if offered else "it opens at none of the "
        offers += "" if offered else f"common rates ({err})"
        raise NoAudioDevice(
            f"{name} cannot be the {what} at {rate} Hz mono ({offers}). Run `voice-assistant --list-devices` and pick "
            f"another with --{kind}-device, or use `voice-assistant serve` and talk in a browser."
        ) from err


@dataclass(frozen=True, slots=True)
class OpenDevices:
    input: int | None
    output: int | None


def check_devices(sd: Any, config: DeviceChoice, output_rate: int | None = None) -> OpenDevices:
    """Resolve the configured devices and check they open at the rates local mode needs (16 kHz in, the voice's rate
    out); raises `NoAudioDevice` with a message that says what to do."""
    if not _devices(sd):
        raise NoAudioDevice(
            "no audio devices found. Use `voice-assistant serve` and talk in a browser, or "
            "`voice-assistant file IN.wav --out OUT.wav`."
        )
    devices = OpenDevices(find_audio_device(sd, config.input_device, "input"),
                          find_audio_device(sd, config.output_device, "output"))  # fmt: skip
    _check_rate(sd, devices.input, "input", TARGET_RATE)
    if output_rate is not None:
        _check_rate(sd, devices.output, "output", output_rate)
    return devices
