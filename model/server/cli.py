"""`dlm-serve`: the OpenAI-compatible API on loopback by default.

Listening on any other address needs a bearer token in the environment variable DLM_API_KEY, so the model is never
exposed by accident. uvicorn handles SIGTERM/SIGINT gracefully: it stops accepting, lets running answers finish for up
to --graceful-timeout seconds, then the app cancels whatever is left (the scheduler stops each generation within one
pass) and exits.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

import uvicorn

from model.chat.spec import DecodingSettings, ModelSpec, add_model_options
from model.errors import ModelError
from model.server.app import create_app
from model.server.config import ServerConfig

API_KEY_ENV = "DLM_API_KEY"
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    defaults = ServerConfig()
    parser = argparse.ArgumentParser(prog="dlm-serve", description="OpenAI-compatible API for the diffusion LM")
    parser.add_argument("--host", default="127.0.0.1", help=f"address to bind (non-loopback needs ${API_KEY_ENV})")
    parser.add_argument("--port", type=int, default=8000)
    add_model_options(parser)
    parser.add_argument("--served-name", action="append", default=None,
                        help="model id clients use (repeatable); default: the model's own name")
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    parser.add_argument("--max-queue", type=int, default=defaults.max_queue)
    parser.add_argument("--max-tokens-limit", type=int, default=defaults.max_tokens_limit)
    parser.add_argument("--default-max-tokens", type=int, default=defaults.default_max_tokens)
    parser.add_argument("--max-context-tokens", type=int, default=defaults.max_context_tokens,
                        help="largest prompt + max_tokens in tokens (the model's own context if that is smaller)")
    parser.add_argument("--graceful-timeout", type=float, default=10.0,
                        help="seconds running answers may finish after SIGTERM/SIGINT")
    parser.add_argument("--decoding", choices=("self-speculative", "autoregressive", "diffusion"), default=None,
                        help="self-speculative | autoregressive | diffusion (default: the model's own)")
    parser.add_argument("--no-drafter", action="store_true",
                        help="draft with the adapter's mask rows, not the model's drafter (for comparisons)")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="answers decoded together in one batched pass (default 8; 1: one at a time)")
    # the choices of model.device.DEVICE_CHOICES, spelled out: importing it imports torch before the flags are checked
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the model runs (auto: a CUDA GPU when torch sees one, else the CPU)")
    parser.add_argument("--weights", choices=("auto", "int4", "bf16"), default="auto",
                        help="the bundled model's weights: int4 (the GGUF's own blocks, default on a CPU) or bf16")
    parser.add_argument("--log-level", default="info")
    return parser


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> ServerConfig:
    """The server config; refuses a non-loopback host without a token (raises SystemExit with the reason)."""
    api_key = environ.get(API_KEY_ENV) or None
    if not is_loopback(args.host) and api_key is None:
        raise SystemExit(f"dlm-serve: listening on {args.host} exposes the model; set {API_KEY_ENV} to require a token")
    try:
        return ServerConfig(
            model_names=tuple(args.served_name or ()),
            api_key=api_key,
            max_body_bytes=args.max_body_bytes,
            max_queue=args.max_queue,
            max_tokens_limit=args.max_tokens_limit,
            default_max_tokens=args.default_max_tokens,
            max_context_tokens=args.max_context_tokens,
        )
    except ValueError as error:
        raise SystemExit(f"dlm-serve: {error}") from error


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    config = config_from_args(args, dict(os.environ))
    if args.max_batch is not None and args.max_batch < 1:
        raise SystemExit(f"dlm-serve: --max-batch must be at least 1, got {args.max_batch}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = ModelSpec(source=args.model, adapter=args.adapter, device=args.device, weights=args.weights,
                         max_batch=args.max_batch,
                         decoding=DecodingSettings(decoding=args.decoding, drafter=not args.no_drafter))
    except ModelError as error:  # a bad --model (or flag for it): refused before anything heavy is imported
        print(f"dlm-serve: {error}", file=sys.stderr)
        sys.exit(2)
    # heavy (torch, transformers): only once the arguments are valid
    from model.chat.engine import DiffusionChatModel
    from model.device import describe, resolve_device
    from model.loading import load_chat_model

    try:
        device = resolve_device(spec.device)
        model = load_chat_model(spec)
    except ModelError as error:
        print(f"dlm-serve: cannot load model: {error}", file=sys.stderr)
        sys.exit(2)
    note = f"; {model.note}" if isinstance(model, DiffusionChatModel) and model.note else ""
    logging.getLogger("dlm-serve").info("model %s on %s%s", model.name, describe(device), note)
    app = create_app(model, config)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
        limit_concurrency=config.max_queue * 4 + 16,  # sockets beyond the queue get 503 from uvicorn itself
    )


if __name__ == "__main__":
    main()
