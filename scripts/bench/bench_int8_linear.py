"""Would int8 linear layers make the bundled model's passes cheaper without breaking self-speculative exactness?

    python scripts/bench/bench_int8_linear.py [--rows 1,4,16] [--repeats 200] [--threads 1] [--json PATH]

For every distinct linear shape of the fused pass (model/runtime/fast_pass.py: q/k/v, o, gate/up, down, the LM head),
with the
bundled model's own weights, times `x @ W.T` for 1, 4 and 16 rows (an autoregressive step, a short and a full
drafting pass) four ways:

* bf16 `F.linear`, what the model runs;
* torch's dynamic int8 linear (`torch.ao.quantization.quantize_dynamic`, fbgemm): int8 weights per output channel,
  the activations quantized per call with one scale for the whole input;
* oneDNN's int8 linear (`torch.ops.onednn.qlinear_pointwise`) with one fixed activation scale, so every row is
  quantized by itself;

and checks what exactness needs: a row's output must not depend on the other rows of the pass (self-speculative
decoding verifies drafts in a 16-row pass and must give the bits an autoregressive 1-row pass gives). Reported per
method: ms per pass summed over the model's layers (the linear part of a pass only), the largest change of row 0's
output between computing it alone and among 16 rows, and the relative error against fp32 on the same rows.

The activations are random (unit normal), so the error column is a floor, not the model's quality: real hidden states
have outlier channels that a fixed int8 scale clips.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from model.process.threads import set_torch_threads

METHODS = ("bf16", "int8 dynamic (fbgemm)", "int8 fixed scale (oneDNN)")


def timed_us(function: Callable[[], object], repeats: int) -> float:
    for _ in range(max(5, repeats // 10)):
        function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def model_shapes() -> list[tuple[str, torch.Tensor, int]]:
    """(name, fp32 weight [out, in], how many per pass) for each fused linear of the bundled model."""
    from model.bundled.default_model import load_default_chat_model

    chat = load_default_chat_model()
    fast = chat.backend.model.inference_pass()
    layer = fast.layers[len(fast.layers) // 2]  # a middle layer's weights; every layer has the same shapes
    count = len(fast.layers)
    return [
        ("q/k/v", layer.qkv.float(), count),
        ("o", layer.o.float(), count),
        ("gate/up", layer.gate_up.float(), count),
        ("down", layer.down.float(), count),
        ("LM head", fast.lm_head.float(), 1),
    ]


class Bf16:
    """What the model runs: bf16 weights and activations."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.bfloat16()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight)


class Int8Dynamic:
    """torch's dynamic int8 linear (fbgemm): one activation scale per call, over every row."""

    def __init__(self, weight: torch.Tensor) -> None:
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        linear.weight.data = weight.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
            self.module = torch.ao.quantization.quantize_dynamic(
                torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8
            )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.float())


class Int8FixedScale:
    """oneDNN int8 linear with a fixed activation scale: each row is quantized on its own, accumulated in int32."""

    def __init__(self, weight: torch.Tensor, x_scale: float, rows: int) -> None:
        self.w_scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
        quantized = torch.round(weight / self.w_scale[:, None]).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(quantized, [rows, weight.shape[1]])
        self.w_zero = torch.zeros(weight.shape[0], dtype=torch.int32)
        self.x_scale = x_scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        qx = torch.clamp(torch.round(x.float() / self.x_scale) + 128, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(
            qx, self.x_scale, 128, self.packed, self.w_scale, self.w_zero, None, 1.0, 0, torch.float32, "none", [], ""
        )


def measure(rows_list: list[int], repeats: int) -> dict[str, object]:
    shapes = model_shapes()
    generator = torch.Generator().manual_seed(0)
    x_scale = 4.0 / 127  # unit-normal activations: +-4 sigma
    per_pass = {method: {rows: 0.0 for rows in rows_list} for method in METHODS}
    row_change = dict.fromkeys(METHODS, 0.0)
    error = dict.fromkeys(METHODS, 0.0)
    table = []
    for name, weight, count in shapes:
        bf16, dynamic = Bf16(weight), Int8Dynamic(weight)
        # each method's linear for a pass of n rows (oneDNN prepacks the weight for the row count it will see)
        linears: dict[str, Callable[[int], Callable[[torch.Tensor], torch.Tensor]]] = {
            "bf16": lambda _rows, f=bf16: f,
            "int8 dynamic (fbgemm)": lambda _rows, f=dynamic: f,
            "int8 fixed scale (oneDNN)": lambda rows, w=weight: Int8FixedScale(w, x_scale, rows),
        }
        for rows in rows_list:
            x = torch.randn(rows, weight.shape[1], generator=generator)
            reference = x @ weight.T
            row = {"linear": name, "rows": rows}
            for method in METHODS:
                run = linears[method](rows)
                xb = x.bfloat16() if method == "bf16" else x  # timed without the cast
                us = timed_us(lambda r=run, v=xb: r(v), repeats)
                row[method] = round(us, 1)
                per_pass[method][rows] += us * count / 1000
                out = run(x).float()
                error[method] = max(error[method], float((out - reference).abs().max() / reference.abs().max()))
                if rows > 1:
                    alone = linears[method](1)(x[:1]).float()
                    row_change[method] = max(row_change[method], float((alone - out[:1]).abs().max()))
            table.append(row)
    return {"rows": rows_list, "linears": table, "per_pass_ms": per_pass, "row0_change_alone_vs_in_pass": row_change,
            "max_relative_error_vs_fp32": error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,4,16", help="rows per pass to time")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    set_torch_threads(args.threads)
    result = measure([int(r) for r in args.rows.split(",")], args.repeats)
    print(f"linear layers of one pass, {args.threads} thread(s), median of {args.repeats} (ms per pass)")
    methods = list(result["per_pass_ms"])
    print("rows | " + " | ".join(methods))
    for rows in result["rows"]:
        print(f"{rows:4d} | " + " | ".join(f"{result['per_pass_ms'][m][rows]:.1f}" for m in methods))
    print("row 0 changed by the other rows of a 16-row pass (max abs): "
          + ", ".join(f"{m} {v:.3g}" for m, v in result["row0_change_alone_vs_in_pass"].items()))
    print("max relative error against fp32 (random activations): "
          + ", ".join(f"{m} {v:.3g}" for m, v in result["max_relative_error_vs_fp32"].items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
