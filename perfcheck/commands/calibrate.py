"""`perfcheck calibrate [--quick|--full] [--base SYSTEM] [--output FILE] [--csv FILE] ...`.

Measures this machine's ceilings with micro-benchmarks (matmul FLOP/s by dtype, size and shape, copy
bandwidth, tiny-op time, framework host costs, collective bus bandwidth and latency by message size
across ranks) and writes a system file in the built-in format, loadable with --system FILE; it
also keeps it in the per-user cache, which predictions without --system use on this machine, when it
passes the sanity checks (not taken under contention, within physical bounds, within 3x of the
machine's previous calibration; --force keeps it anyway). --show lists the cache, --clear empties it.
Progress goes to stderr; the summary to stdout. The default run takes under a minute on a CPU.
"""
from __future__ import annotations

import sys

from perfcheck.commands.checks import check_output_file, check_system, positive_int

#: perfcheck.calibrate's PEAK_CONVENTIONS, spelled here so building the CLI parser imports no torch
#: (tests/calibrate/test_calibrate.py checks they agree).
PEAK_CONVENTIONS = ("base", "measured")


def add_parser(subparsers):
    p = subparsers.add_parser("calibrate", help="measure this machine's ceilings and write a system file",
                              description=__doc__.split("\n\n")[1])
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_const", dest="mode", const="quick",
                       help="fewer shapes and repeats (CPU: the local cases take 4-13 s on a 2-core VM; the "
                            "collectives, the process-concurrency and the DeepSpeed engine cases add 35-130 s; --no-comm "
                            "skips them)")
    speed.add_argument("--full", action="store_const", dest="mode", const="full", help="more shapes, sizes and repeats")
    p.add_argument("--base", metavar="SYSTEM",
                   help="system to start from (name or JSON path; default: cpu, or this GPU's spec)")
    p.add_argument("--output", "-o", metavar="FILE", help="system file to write (default: <name>.json)")
    p.add_argument("--name", help="name of the calibrated system (default: <base>-calibrated)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="device to calibrate (default: cuda if available)")
    p.add_argument("--dtypes", metavar="LIST", help="comma-separated matmul dtypes (default: those the base lists)")
    p.add_argument("--peaks", choices=PEAK_CONVENTIONS,
                   help="base: keep datasheet peaks, efficiency = measured/peak (GPU default); "
                        "measured: peaks = best measured (CPU default)")
    p.add_argument("--no-comm", action="store_true", help="skip the multi-process collective benchmark (and the "
                                                          "process-concurrency and DeepSpeed engine cases)")
    p.add_argument("--no-deepspeed", action="store_true",
                   help="skip the DeepSpeed engine case (ZeRO stages' own host cost; run when DeepSpeed is installed)")
    p.add_argument("--world-size", type=positive_int, default=2, help="ranks for the CPU collective benchmark (default 2)")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="CPU intra-op threads (default: torch's setting, as runs use)")
    p.add_argument("--clock", choices=("wall", "process"), default="wall",
                   help="CPU timer: wall (default) or process (this process's CPU time, --threads 1 only: a neighbour's "
                        "load does not enter it, so it may be kept on a busy machine)")
    p.add_argument("--csv", metavar="FILE", help="also write every measurement (one row per case) as CSV")
    p.add_argument("--no-cache", action="store_true",
                   help="do not keep the result in the per-user cache ($PERFCHECK_CACHE_DIR or ~/.cache/perfcheck), "
                        "which predictions without --system use on this machine")
    p.add_argument("--force", action="store_true",
                   help="keep the result in the cache even when the sanity checks refuse it (taken under contention, "
                        "outside physical bounds, far from the previous calibration); the record says so")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--show", action="store_true",
                       help="list the calibrations in the per-user cache (when, threads, load, key figures) and exit")
    cache.add_argument("--clear", action="store_true",
                       help="delete this machine's calibration for --threads (default torch's setting) from the cache "
                            "and exit; with --all, every calibration in the cache folder")
    p.add_argument("--all", action="store_true", help="with --clear: every calibration in the cache folder")
    p.set_defaults(run=run, mode="default")


def _progress(message: str):
    print(f"calibrate {message}", file=sys.stderr, flush=True)


def show() -> int:
    """``--show``: one block per cached calibration: file, name, when/threads/load, key figures."""
    from perfcheck.errors import UserError
    from perfcheck.hardware import cache
    from perfcheck.calibrate import sanity
    from perfcheck.hardware.labels import describe
    from perfcheck.hardware.systems import load_system

    files = cache.cached_files()
    if not files:
        print(f"no calibration in the per-user cache {cache.cache_dir()}")
        return 0
    for path in files:
        try:
            spec = load_system(str(path))
        except UserError as exc:
            print(f"{path}\n  unreadable: {exc}")
            continue
        print(f"{path}\n  {spec.name}: {describe(spec.calibration) or 'when and under what load: not recorded'}")
        figures = sanity.key_figures(spec)
        print("  " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
        bad = sanity.problems(spec)
        if bad:
            print("  would not be kept today: " + "; ".join(bad))
    return 0


def clear(args) -> int:
    """``--clear``: delete this machine's calibration (``--all``: every one in the cache folder)."""
    from perfcheck.hardware import cache

    gone = cache.clear(args.device, args.threads, every=args.all)
    for path in gone:
        print(f"deleted {path}")
    if not gone:
        print(f"nothing to delete: no {'calibration' if args.all else 'calibration of this machine'} in "
              f"{cache.cache_dir()}")
    return 0


def run(args) -> int:
    from perfcheck.calibrate.run import calibrate
    from perfcheck.calibrate.fit import summary_rows
    from perfcheck.errors import UserError

    if args.all and not args.clear:
        raise UserError("--all: only with --clear")
    if args.show:
        return show()
    if args.clear:
        return clear(args)
    check_system(args.base, "--base")  # every argument checked before a benchmark starts
    check_output_file(args.output, "--output")
    check_output_file(args.csv, "--csv")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else None
    if args.clock == "process" and args.threads != 1:
        raise UserError("--clock process: needs --threads 1 (process CPU time sums every thread's)")
    result = calibrate(args.base, mode=args.mode, device=args.device, dtypes=dtypes, peaks=args.peaks,
                       comm=not args.no_comm, world_size=args.world_size, name=args.name,
                       threads=args.threads, progress=_progress, deepspeed=False if args.no_deepspeed else None,
                       clock=args.clock)
    out = args.output or f"{result.spec.name}.json"
    try:
        result.spec.save(out)
        if args.csv:
            result.measurements.to_csv(args.csv, index=False)
    except OSError as exc:
        raise UserError(f"output: cannot write {exc.filename or out!r}: {exc.strerror}") from None
    if not args.no_cache:
        from perfcheck.calibrate.auto import refusals
        from perfcheck.hardware.cache import save_to_cache
        from perfcheck.calibrate.sanity import stamped

        why = refusals(result.spec, args.device, args.threads)
        if why and not args.force:
            print(f"not kept in the per-user cache: {'; '.join(why)}. {out} is written; rerun when the machine is "
                  f"quiet, or keep it anyway with --force", file=sys.stderr)
        else:
            spec = stamped(result.spec, {**result.spec.calibration, "forced": True}) if why else result.spec
            kept = save_to_cache(spec, args.device, args.threads)
            print(f"kept in the per-user cache {kept} (predictions without --system on this machine, with the same "
                  f"threads, use it){' against the sanity checks (--force): ' + '; '.join(why) if why else ''}",
                  file=sys.stderr)
    width = max(len(w) for w, _ in summary_rows(result.spec, result.measurements))
    for what, value in summary_rows(result.spec, result.measurements):
        print(f"{what.ljust(width)}  {value}")
    for note in result.notes:
        print(f"note: {note}")
    print(f"wrote {out} ({result.elapsed_s:.0f} s); use it with --system {out}", file=sys.stderr)
    return 0
