"""`python -m benchmarks [step] [peers] [memory] [kernels] [data] [loader] [native_distance] [overhead] [chaos]
[ops] [gemm]
[key=value ...]`: tables.

    python -m benchmarks step peers                         # swin_tiny, batch 4, 224 px, fp32 graph mode
    python -m benchmarks memory                             # peak RSS at batch 16: swinexp, MindCV, timm
    python -m benchmarks kernels                            # memory MindSpore kernels hold, and the steps
    python -m benchmarks ops --batch 8                      # kernel time per op kind: swinexp vs timm (profilers)
    python -m benchmarks gemm --iters 9                     # each Linear GEMM per orientation: MindSpore vs torch
    python -m benchmarks step --model swin_micro --batch 8 --img-size 64 --iters 5 --warmup 2
    python -m benchmarks step optimizer.lr=1e-4 --variants baseline "all three" "model.qkv=split amp=o2"
    python -m benchmarks step --max-resident 3              # hosts that cannot hold all compiled variants
    python -m benchmarks data --images 512 --workers 2
    python -m benchmarks data --source-size 500x375          # ImageNet-sized JPEGs, cropped to 224
    python -m benchmarks loader --step-ms 454 --batch 256    # worker/main cost, bytes, cores per card
    python -m benchmarks native_distance --images 200        # data.pipeline=native's pixels vs timm's, per op
    python -m benchmarks overhead --mlflow                  # also log the table as an MLflow run
    python -m benchmarks chaos --kills 30                   # SIGKILL + resume a training 30 times
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from difflib import get_close_matches
from pathlib import Path

from benchmarks import chaos, data, gemm, kernels, loader, memory, native_distance, ops, overhead, peers, step
from benchmarks.harness import compose, configure_device, quiet_cell_teardown, release_compiled
from benchmarks.host import NotEnoughMemory
from benchmarks.options import Options
from benchmarks.record import BenchRecorder
from benchmarks.table import BenchResult
from benchmarks.timing import progress
from swinexp.registry import ConfigError

BENCHMARKS: dict[str, Callable[[Options], BenchResult | None]] = {
    "step": step.run, "peers": peers.run, "memory": memory.run, "kernels": kernels.run, "data": data.run,
    "loader": loader.run, "native_distance": native_distance.run, "overhead": overhead.run, "chaos": chaos.run,
    "ops": ops.run, "gemm": gemm.run}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("items", nargs="*", metavar="BENCH|OVERRIDE",
                        help=f"sub-benchmarks ({', '.join(BENCHMARKS)}; default: step) and Hydra overrides applied "
                             "to every variant (key=value, +group=option)")
    parser.add_argument("--model", help="conf/model option (default: swin_tiny for step/peers, run.py's for overhead)")
    parser.add_argument("--batch", type=int, help="data.batch_size (default: 4 for step/peers, 16 for memory, 64 "
                                                           "for data)")
    parser.add_argument("--img-size", type=int, help="data.img_size (default: 224 for step/peers/data/loader, 32 for "
                                                           "native_distance)")
    parser.add_argument("--num-classes", type=int, default=1000, help="head classes for step/peers (default: 1000)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per candidate (default: 5)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed rounds after the compiling call, step/peers (default: 3); data and overhead "
                             "use one untimed epoch / process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=[], metavar="VARIANT",
                        help="step: presets (" + ", ".join(f"'{v}'" for v in step.PRESETS) + ") or quoted "
                             "overrides such as 'model.qkv=split amp=o2'; the first is the ratio's reference. "
                             "Give it last: it takes every value that follows")
    parser.add_argument("--max-resident", type=int, default=0,
                        help="step: at most this many compiled variants per process (reference included); "
                             "0 = all in one process (default)")
    parser.add_argument("--images", type=int, default=512, help="data/loader: JPEG files per split; native_distance: "
                                                                    "JPEGs compared (default: 512)")
    parser.add_argument("--source-size", metavar="WxH",
                        help="data: size of the JPEGs the pipelines decode, e.g. 500x375 as an ImageNet photo "
                             "(default: --img-size square)")
    parser.add_argument("--workers", type=int, default=2, help="data: measure 1..N pipeline workers (default: 2)")
    parser.add_argument("--step-ms", type=float, default=454.0,
                        help="loader: train step time (ms) a card's feed must sustain at --batch (default: 454)")
    parser.add_argument("--kills", type=int, default=3, help="chaos: SIGKILLs of the training (default: 3)")
    parser.add_argument("--mlflow", action="store_true", help="log the tables and figures as an MLflow run "
                                                              "(experiment swinexp-bench)")
    parser.add_argument("--tracking-uri", help="MLflow store for --mlflow (default: ./mlflow.db, as training)")
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)  # worker of --max-resident: raw timings
    parser.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def parse(argv: Sequence[str]) -> tuple[list[str], Options, argparse.Namespace]:
    """Sub-benchmark names (in order, default ["step"]), the options, and the raw namespace."""
    args = _parser().parse_intermixed_args(argv)
    names = [item for item in args.items if "=" not in item and not item.startswith(("+", "~"))]
    for name in names:
        if name not in BENCHMARKS:
            hint = get_close_matches(name, BENCHMARKS, n=1)
            raise ConfigError(f"'{name}' is not a sub-benchmark nor a key=value override; choose from "
                              f"{', '.join(BENCHMARKS)}" + (f". Did you mean '{hint[0]}'?" if hint else ""))
    opts = Options(model=args.model, batch=args.batch, img_size=args.img_size, num_classes=args.num_classes,
                   iters=args.iters, warmup=args.warmup, seed=args.seed,
                   overrides=tuple(item for item in args.items if item not in names),
                   variants=tuple(args.variants), max_resident=args.max_resident, images=args.images,
                   source_size=args.source_size, workers=args.workers, kills=args.kills,
                   step_ms=args.step_ms)
    if opts.kills < 1:
        raise ConfigError(f"--kills={opts.kills} must be >= 1")
    if opts.source_size is not None:
        data.parse_size(opts.source_size)  # a bad size fails here, not after the other sub-benchmarks ran
    if opts.iters < 1 or opts.warmup < 0:
        raise ConfigError(f"--iters={opts.iters} must be >= 1 and --warmup={opts.warmup} >= 0")
    return list(dict.fromkeys(names)) or ["step"], opts, args


def _measure_group(opts: Options, group: int, out: Path) -> None:
    """Worker mode of `step --max-resident`: time these variants, write the raw timings as JSON."""
    measured, failed = step.measure(opts, [step.parse_variant(v) for v in opts.variants or step.DEFAULT_VARIANTS],
                                    group)
    out.write_text(json.dumps({"measured": [asdict(m) for m in measured], "failed": failed}))


def run_all(names: list[str], opts: Options, recorder: BenchRecorder | None) -> None:
    """Run the sub-benchmarks in turn; print each table, and log it, as soon as it is done."""
    for name in names:
        result = BENCHMARKS[name](opts)
        release_compiled()  # the next sub-benchmark gets the memory
        if result is not None:
            print(result.table.markdown() + "\n", flush=True)
            if recorder is not None:
                recorder.log(result)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sub-benchmarks, print each table to stdout (progress to stderr); 2 on a usage error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_cell_teardown()
    try:
        names, opts, args = parse(argv)
        configure_device(compose(list(opts.overrides)).with_values({"seed": opts.seed}))
        if args.json_out is not None:
            _measure_group(opts, args.group, args.json_out)
        elif not args.mlflow:
            run_all(names, opts, None)
        else:
            recorder = BenchRecorder(args.tracking_uri, names, opts, "python -m benchmarks " + shlex.join(argv))
            progress(f"logging to MLflow: experiment swinexp-bench, run {recorder.run_id}")
            status = "FAILED"
            try:
                run_all(names, opts, recorder)
                status = "FINISHED"
            except KeyboardInterrupt:
                status = "KILLED"
                raise
            finally:
                recorder.close(status)
    except (ConfigError, NotEnoughMemory, step.WorkerFailed, chaos.ChaosFailed) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
