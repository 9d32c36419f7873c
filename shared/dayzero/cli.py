"""``dayzero`` command line: the model tools (demo-checkpoint, train-demo, generate, align, quantize, inspect),
``doctor``, and the service commands (in dayzero.cli_services)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from importlib.metadata import version

from . import cli_args
from .checkpoint_files import CheckpointError, checkpoint_directory
from .cli_generate import cmd_generate, prompt_of
from .cli_services import add_service_commands
from .config import ConfigError, ModelConfig
from .settings import Settings
from .settings_help import settings_from_env, unknown_settings
from .train.command import add_train_demo


def cmd_demo_checkpoint(args: argparse.Namespace, settings: Settings) -> int:
    from .demo import write_demo_checkpoint

    print(write_demo_checkpoint(args.out, seed=args.seed, vision=args.vision, fp4=args.fp4, shards=args.shards))
    return 0


def cmd_align(args: argparse.Namespace, settings: Settings) -> int:
    from .align import align
    from .model.plan import AttentionOptions
    from .parallel.launch import launch_from

    checkpoint = checkpoint_directory(args.checkpoint)
    cfg = ModelConfig.from_file(checkpoint)
    if args.prompt is None and args.prompt_ids is None:
        prompt = [random.Random(0).randrange(cfg.vocab_size) for _ in range(64)]
    else:
        prompt = prompt_of(args, checkpoint)
    if len(prompt) + args.tokens > cfg.max_position_embeddings:  # (it ran on, for hours, past the model's)
        raise ValueError(
            f"{len(prompt)} prompt tokens and --tokens {args.tokens} are past the model's context "
            f"(max_position_embeddings {cfg.max_position_embeddings})"
        )
    launch = launch_from(os.environ, "cpu")  # torchrun's variables, if set; the comparison is fp32 on the CPU
    report = align(checkpoint, prompt, args.tokens, AttentionOptions.of(settings), args.tensor_parallel, launch)
    if launch is not None and launch.config.rank:  # every rank compares; rank 0 prints
        return 0 if report.ok else 1
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(f"prompt tokens      {report.prompt_tokens}")
        print(
            f"logits max abs err {report.max_abs_err:.3e}  (tolerance {report.tolerance:.0e}; reference ties "
            "broken towards the earliest entry, as dayzero breaks them)"
        )
        print(
            f"  with torch's own tie order {report.plain_max_abs_err:.3e}; "
            f"{report.tied_queries} of {report.indexer_queries} indexer queries tie at the top-k boundary"
        )
        print(f"logits max rel err {report.max_rel_err:.3e}")
        for i, err in enumerate(report.layers):
            print(f"  layer {i:3d} hidden max abs err {err:.3e}")
        for s in report.steps:
            print(f"  decode step {s.step:3d} tokens {s.reference_token}/{s.dayzero_token} err {s.max_abs_err:.3e}")
        print(f"sparse vs dense (CSA selection off) logits max abs diff {report.sparse_vs_dense_max_abs:.3e}")
        print(f"greedy tokens match: {report.greedy_match}  ->  {'OK' if report.ok else 'FAIL'}")
    return 0 if report.ok else 1


def cmd_quantize(args: argparse.Namespace, settings: Settings) -> int:
    from .quant.quantize import quantize_checkpoint

    print(quantize_checkpoint(args.input, args.output, experts=args.experts, shards=args.shards))
    return 0


def cmd_inspect(args: argparse.Namespace, settings: Settings) -> int:
    from .quant.inspect import inspect, render

    sizes = (args.batch, args.context, args.devices, args.expert_cache_gib, args.tensor_parallel)
    report = inspect(args.path, *sizes, settings)
    print(json.dumps(report.to_dict()) if args.json else render(report))
    return 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    import httpx

    from .doctor import Doctor, report

    try:
        url = httpx.URL(args.url)
    except httpx.InvalidURL as exc:  # a bad port or address: httpx's traceback otherwise
        raise ValueError(f"{args.url!r} is not a gateway URL such as http://127.0.0.1:8000 ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host or not 0 < (url.port or 80) < 65536:
        raise ValueError(f"{args.url!r} is not a gateway URL such as http://127.0.0.1:8000")
    results = Doctor(args.url, args.api_key, args.timeout).run()
    print(report(results, args.json))
    return 0 if all(r.status != "fail" for r in results) else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dayzero",
        description="Serve DeepSeek-V4-family models from day zero.",
        epilog="Settings are environment variables DAYZERO_*: `dayzero up --help` lists them.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('dayzero')}")
    sub = p.add_subparsers(dest="command", required=True)

    shards_help = "weights in N files with an index (default 1; at most one file per tensor)"
    demo = sub.add_parser("demo-checkpoint", help="write the tiny random-weight DeepSeek-V4 checkpoint")
    demo.add_argument(
        "out",
        type=cli_args.out_dir,
        metavar="OUT",
        help="directory to write (config.json, model.safetensors, tokenizer.json, ...)",
    )
    demo.add_argument(
        "--seed", type=cli_args.seed, default=0, metavar="N", help="random seed of the weights (default 0)"
    )
    demo.add_argument("--vision", action="store_true", help="add a tiny vision tower (visual.*) and the image token")
    demo.add_argument("--fp4", action="store_true", help="the release's formats: FP4 experts, FP8 dense, E8M0 scales")
    demo.add_argument("--shards", type=cli_args.positive, default=1, metavar="N", help=shards_help)
    demo.set_defaults(run=cmd_demo_checkpoint)
    add_train_demo(sub)

    def prompt_args(cmd: argparse.ArgumentParser, required: bool) -> None:
        group = cmd.add_mutually_exclusive_group(required=required)
        group.add_argument(
            "--prompt", metavar="TEXT", help="prompt text (tokenized with the checkpoint's tokenizer.json)"
        )
        group.add_argument("--prompt-ids", metavar="1,2,3", help="prompt as comma-separated token ids, e.g. 1,2,3")

    def tensor_parallel(cmd: argparse.ArgumentParser, what: str) -> None:
        cmd.add_argument(
            "--tensor-parallel", type=cli_args.positive, default=1, metavar="N", help=f"{what} (default 1)"
        )

    joining = "; under torchrun (RANK, WORLD_SIZE, ... set) join its group as one rank"

    gen = sub.add_parser("generate", help="stream a completion to the terminal")
    gen.add_argument("--checkpoint", metavar="DIR", help=cli_args.CHECKPOINT_HELP)
    prompt_args(gen, required=True)
    gen.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="most tokens to generate (default 64, or what DAYZERO_MAX_TOKENS_LIMIT or the context leaves)",
    )
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1.0)")
    gen.add_argument(
        "--top-k", type=cli_args.top_k, default=0, metavar="K", help="sample among the k best tokens (0 or -1 = all)"
    )
    gen.add_argument(
        "--seed", type=cli_args.seed, metavar="S", help="sampling seed (any 64-bit integer), for repeatable samples"
    )
    gen.add_argument("--stop", action="append", default=[], metavar="STR", help="stop string (repeatable)")
    gen.add_argument("--stats", action="store_true", help="end with one JSON line of token counts and speeds")
    tensor_parallel(gen, "run the model on N ranks (local ones: gloo on CPU), as one group" + joining)
    timeout = "ranks that do not all meet, or a collective left waiting by a silent rank, fail after S s (default 120)"
    gen.add_argument("--group-timeout", type=cli_args.positive_float, default=120.0, metavar="S", help=timeout)
    spec = "tokens the MTP layer drafts per step (default: DAYZERO_SPECULATIVE_TOKENS, 0)"
    gen.add_argument("--speculative-tokens", type=int, choices=(0, 1, 2), metavar="0|1|2", help=spec)
    gen.set_defaults(run=cmd_generate)

    al = sub.add_parser("align", help="compare logits with transformers' DeepseekV4ForCausalLM (fp32)")
    al.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint directory")
    prompt_args(al, required=False)
    al.add_argument(
        "--tokens", type=cli_args.positive, default=8, metavar="N", help="greedy decode steps to compare (default 8)"
    )
    al.add_argument("--json", action="store_true", help="print one JSON object")
    tensor_parallel(al, "run dayzero's side on N ranks (gloo on CPU), as one group" + joining)
    al.set_defaults(run=cmd_align)

    quant = sub.add_parser("quantize", help="write a checkpoint in the release's FP8 / FP4 formats from a float one")
    quant.add_argument("input", metavar="IN", help="float checkpoint directory")
    out_help = "directory to write (not IN, inside it or around it)"
    quant.add_argument("output", metavar="OUT", type=cli_args.out_dir, help=out_help)
    quant.add_argument(
        "--experts",
        choices=["fp4", "fp8"],
        default="fp4",
        metavar="fp4|fp8",
        help="routed experts: fp4 (MXFP4, the Instruct releases; default) or fp8 (the Base releases)",
    )
    quant.add_argument("--shards", type=cli_args.positive, default=1, metavar="N", help=shards_help)
    quant.set_defaults(run=cmd_quantize)

    defaults = Settings.model_fields
    insp = sub.add_parser(
        "inspect",
        help="parameter counts, dtypes and a memory plan (headers + config only)",
        description="Parameter counts, tensor dtypes and a memory plan, from the safetensors headers and the "
        f"config (no weights read). The plan is for a run of the settings in the environment: DAYZERO_DTYPE "
        f"({defaults['dtype'].default} unless set), which the dense weights, experts not kept in FP4 and the "
        f"attention state are held in, and DAYZERO_SPECULATIVE_TOKENS ({defaults['speculative_tokens'].default} "
        "unless set), above 0 the MTP layer's state per sequence too (its weights are counted whenever the "
        f"checkpoint ships it), DAYZERO_BLOCK_SIZE ({defaults['block_size'].default} unless set), the rows of "
        "the pool blocks the attention state is held in (a sequence holds whole blocks), and the pools a worker "
        "allocates: DAYZERO_KV_BUDGET_MB (unless set, on CPU the least holding the windows and one sequence of the "
        "context limit, or 256 MiB if more; on CUDA that least, the worker taking DAYZERO_KV_MEMORY_FRACTION of "
        "the device's memory less its weights where more), with the windows of "
        f"DAYZERO_MAX_BATCH ({defaults['max_batch'].default} unless set) sequences, one more under "
        "DAYZERO_DECODE_GRAPHS (its padding rows; the graphs' own memory is not planned).",
    )
    insp.add_argument(
        "path",
        metavar="CHECKPOINT|CONFIG|deepseek-v4-flash|deepseek-v4-pro",
        help="checkpoint directory, config.json, or a released config by its name",
    )
    insp.add_argument(
        "--batch", type=cli_args.positive, default=1, metavar="B", help="concurrent sequences (default 1)"
    )
    context = "tokens per sequence (default 65536, or the model's context if shorter)"
    insp.add_argument("--context", type=cli_args.positive, metavar="L", help=context)
    devices = "devices the experts are spread over (default 1)"
    insp.add_argument("--devices", type=cli_args.positive, default=1, metavar="N", help=devices)
    cache = "dequantized expert cache budget (default 0)"
    insp.add_argument("--expert-cache-gib", type=cli_args.non_negative_float, default=0.0, metavar="G", help=cache)
    insp.add_argument("--json", action="store_true", help="print one JSON object")
    tensor_parallel(insp, "also print the per-rank bytes of an N-rank tensor-parallel group")
    insp.set_defaults(run=cmd_inspect)

    doctor = sub.add_parser("doctor", help="check a running deployment end to end (exit 1 on any failure)")
    doctor.add_argument("url", metavar="URL", help="the gateway, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    doctor.add_argument(
        "--timeout",
        type=cli_args.positive_float,
        default=60.0,
        metavar="S",
        help="seconds to wait for each answer (default 60; the first, readiness, at most 10)",
    )
    doctor.add_argument("--api-key", metavar="KEY", help="Bearer key, when the gateway requires one")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.set_defaults(run=cmd_doctor)

    add_service_commands(sub)
    return p


def _run(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    for warning in unknown_settings(os.environ):
        print(f"warning: {warning}", file=sys.stderr)
    try:  # every input error, from the command line or the environment, is one line and exit code 2
        return args.run(args, settings_from_env())
    except (ConfigError, CheckpointError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:  # a group whose ranks did not meet: not the input's fault
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # (an OSError) the reader of stdout left: main stops quietly
        raise
    except OSError as exc:  # the machine's: a directory not writable, a full disk
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # inside the try: a reader that left shows here, not at interpreter exit
    except BrokenPipeError:  # the reader of stdout left (`| head`): stop quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line (after a half-printed one) and the shell's code for SIGINT
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
