"""The ``fedsim trace`` command: generate, info, plot, convert.

``add_trace_commands(subparsers)`` hangs the command on the CLI's argparse tree; every
sub-command sets ``func`` to a handler ``(args) -> int``. User mistakes raise FedsimError,
which the CLI prints as one ``error:`` line.

Building the parser needs only numpy (the generator list); the handlers import the Parquet
reader and writer (pyarrow) themselves, so that ``fedsim --help`` does not load them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Callable

import numpy as np

from fedsim.config.catalog import CONVERTERS, GENERATORS
from fedsim.config.schema import toml_value
from fedsim.errors import FedsimError
from fedsim.files import TRACE_PICTURE, check_out, human_duration
from fedsim.traces.converters import TIME_UNITS, convert
from fedsim.traces.generators import generate
from fedsim.traces.schema import Trace
from fedsim.traces.stats import summarize
from fedsim.traces.zones import beside, by_zone, trace_zones

REPETITION = ("repeat", "recorded_online_s", "online_s", "short_records")


def add_trace_commands(subparsers, run_trace: Callable[[Path], Trace] | None = None) -> None:
    """`run_trace(run_dir)`: the trace a run directory replays (the CLI gives it, from a layer
    above this one), for `trace info` and `trace plot` of a run directory."""
    trace = subparsers.add_parser(
        "trace", help="make, inspect, plot and convert availability traces",
        description="Availability traces: Parquet files of online intervals per device.")
    sub = trace.add_subparsers(dest="trace_command", metavar="{generate,info,plot,convert}")
    sub.required = True
    _add_generate(sub)

    devices_help = ("device table with the devices' tz_offset or group (default: the table beside "
                    "the trace that `trace convert` writes, else the trace's own metadata)")
    info = sub.add_parser("info", help="statistics of a trace file, by time zone where known")
    info.add_argument("file", help="trace .parquet, or a run directory (the trace the run replays)")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.add_argument("--devices", metavar="TABLE", help=devices_help)
    info.set_defaults(func=info_command, run_trace=run_trace)

    plot = sub.add_parser("plot", help="device x time raster (by time zone) and fraction online, as PNG")
    plot.add_argument("file", help="trace .parquet, or a run directory (the trace the run replays)")
    plot.add_argument("--out", required=True, help="PNG to write")
    plot.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    plot.add_argument("--devices", metavar="TABLE", help=devices_help)
    plot.set_defaults(func=plot_command, run_trace=run_trace)

    conv = sub.add_parser("convert", help="convert a third-party trace dump to Parquet")
    conv.add_argument("--from", dest="fmt", required=True, metavar="FORMAT",
                      help=f"input format: {', '.join(CONVERTERS.names())}, or a plugin's "
                           "'module:function' (docs/extending.md)")
    conv.add_argument("input", help="file to convert")
    conv.add_argument("--out", required=True, help="trace .parquet to write")
    conv.add_argument("--force", action="store_true", help="overwrite --out (and the device table beside it) "
                                                         "if it exists")
    conv.add_argument("--horizon", type=float, help="seconds to cover (default: the input's span)")
    conv.add_argument("--devices-out", help="also write the device table (names, tz_offset, the "
                                            "source's per-device columns) here")
    conv.add_argument("--repeat", metavar="MODE",
                      help="flash: span (default: each device's record repeats over its own "
                           "first-to-last-message span, as FLASH replays it) or none (only what was "
                           "recorded); fedscale: period (default: each client repeats every "
                           "finish_time, as FedScale replays it) or none; csv, sessions: none")
    conv.add_argument("--wrap", choices=("none", "loop"),
                      help="past the trace's horizon: loop (a run replays it again from its start) or none (every "
                           "device offline); default: fedscale's --repeat period loops, the rest do not")
    conv.add_argument("--time-unit", metavar="UNIT",
                      help=f"csv, sessions: times written as {', '.join(TIME_UNITS)} (seconds or "
                           "milliseconds since 1970, ISO 8601); default: detected (docs/traces.md)")
    conv.add_argument("--tz", help="csv, sessions: UTC offset of ISO times written without one, "
                                   "e.g. +02:00 (default UTC)")
    for flag, default in zip(("--device-col", "--start-col", "--end-col"), ("device_id", "start", "end")):
        conv.add_argument(flag, metavar="NAME",
                          help=f"csv: header column of the {flag[2:-4]} (default {default})")
    conv.set_defaults(func=convert_command)


def _add_generate(sub) -> None:
    kinds = "\n".join(
        f"  {name}: {spec.doc}\n    options: "
        + (", ".join(f"{k}={v!r}" for k, v in spec.options.items()) or "none")
        for name, spec in GENERATORS.items())
    plugins = [name for name in GENERATORS.names() if name not in GENERATORS]
    kinds += "".join(f"\n  {name}: installed plugin (options as --set key=value)" for name in plugins)
    gen = sub.add_parser(
        "generate", help="synthesise a trace", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Synthesise an availability trace.",
        epilog=f"generators (options with defaults; None: not set):\n{kinds}\n\n"
               "Options go as --set key=value (value is a TOML literal, e.g. --set p=0.3, "
               "--set tz_offsets=[0,8])\nor as --key value.")
    gen.add_argument("kind", help=f"one of: {', '.join(GENERATORS.names())}, or a plugin's "
                                  "'module:SPEC' (docs/extending.md)")
    gen.add_argument("--devices", type=int, required=True, help="number of devices")
    extent = gen.add_mutually_exclusive_group(required=True)
    extent.add_argument("--days", type=float, help="wall-clock length in days")
    extent.add_argument("--rounds", type=int, help="number of rounds (round-indexed generators)")
    gen.add_argument("--round-duration", type=float, default=1.0, help="seconds per round (1)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--out", required=True, help="trace .parquet to write")
    gen.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    gen.add_argument("--devices-out", help="also write a device table (tz offsets) here")
    gen.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                     help="a generator option")
    options = sorted({key for spec in GENERATORS.values() for key in spec.options})
    for key in options:
        flags = [f"--{key}"] + ([f"--{key.replace('_', '-')}"] if "_" in key else [])
        gen.add_argument(*flags, dest=f"option:{key}", default=argparse.SUPPRESS,
                         metavar="VALUE", help=argparse.SUPPRESS)
    gen.set_defaults(func=generate_command)


# -- handlers -------------------------------------------------------------------------------

def generate_command(args) -> int:
    from fedsim.traces.io import write_trace

    options = {}
    for item in args.sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise FedsimError(f"--set {item!r}: expected key=value, e.g. --set p=0.3")
        options[key.strip()] = parse_value(value)
    for name, value in vars(args).items():
        if name.startswith("option:"):
            options[name.removeprefix("option:")] = parse_value(value)
    if args.days is not None and not args.days > 0:
        raise FedsimError(f"--days {args.days}: give a number of days > 0")
    if args.devices < 1:
        raise FedsimError(f"--devices {args.devices}: give a number of devices >= 1")
    check_out(args.out, args.force, suffix=".parquet")
    check_out(args.devices_out, args.force, flag="--devices-out", suffix=".parquet")
    began = time.perf_counter()
    trace = generate(args.kind, args.devices, seed=args.seed, rounds=args.rounds,
                     round_duration=args.round_duration, days=args.days, **options)
    write_trace(trace, args.out)
    print(f"wrote {args.out}: {_one_line(trace)} ({time.perf_counter() - began:.2f} s)")
    if args.devices_out:
        table = device_table(trace, {"group": trace.generator["group"]}
                             if isinstance(trace.generator.get("group"), list) else {})
        _write_device_table(table, args.devices_out, list(table), trace.n_devices)
    return 0


def _write_device_table(table, path: str, columns: list[str], n_devices: int) -> None:
    from fedsim.traces.io import write_device_table

    write_device_table(table, path)
    print(f"wrote {path}: the device table ({', '.join(columns)}) of the {n_devices} device{'s' * (n_devices != 1)}")


def read_given(args) -> Trace:
    """The trace file, or the trace of a run directory (generated again from its record)."""
    from fedsim.traces.io import read_trace

    if Path(args.file).is_dir() and args.run_trace is not None:
        return args.run_trace(Path(args.file))
    return read_trace(args.file)


def info_command(args) -> int:
    trace = read_given(args)
    summary = summarize(trace)
    zones = trace_zones(trace, args.file, args.devices)
    summary["by_zone"] = None if zones is None else {"column": zones.column, "source": zones.source,
                                                     "rows": by_zone(trace, zones)}
    summary["repetition"] = {k: trace.generator[k] for k in REPETITION if k in trace.generator} or None
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(args.file, summary))
    return 0


def plot_command(args) -> int:
    from fedsim.traces.plot import plot_trace

    check_out(args.out, args.force, inputs=[args.file, args.devices], redraws=TRACE_PICTURE, suffix=".png")
    trace = read_given(args)
    shown = plot_trace(trace, args.out, zones=trace_zones(trace, args.file, args.devices))
    print(f"wrote {args.out}: {shown} of {trace.n_devices} devices")
    return 0


def convert_command(args) -> int:
    import dataclasses

    from fedsim.traces.io import checked_device_table, write_trace

    for out, flag in ((args.out, "--out"), (str(beside(args.out)), "--out's device table"),
                      (args.devices_out, "--devices-out")):
        check_out(out, args.force, inputs=[args.input], flag=flag, suffix=".parquet")
    trace = convert(args.fmt, args.input, horizon=args.horizon, time_unit=args.time_unit,
                    tz=args.tz, device_col=args.device_col, start_col=args.start_col,
                    end_col=args.end_col, repeat=args.repeat)
    generator = dict(trace.generator)
    columns, warnings = generator.pop("device_columns", {}), generator.pop("warnings", [])
    trace = dataclasses.replace(trace, generator=generator, wrap=args.wrap or trace.wrap)  # (metadata stays small)
    table = device_table(trace, columns)
    next_to = str(beside(args.out))
    same = args.devices_out and Path(args.devices_out).resolve() == Path(next_to).resolve()
    # beside the trace when there is more than the ids to say; at --devices-out as asked
    paths = ([next_to] if len(table) > 1 or same else []) + ([args.devices_out] if args.devices_out and not same else [])
    tables = {path: checked_device_table(table, path) for path in paths}  # a bad one stops before any write
    write_trace(trace, args.out)
    print(f"wrote {args.out}: {_one_line(trace)}")
    if "merged" in trace.generator:
        print(f"merged {trace.generator['merged']} overlapping or touching sessions")
    for line in [*warnings, *_repetition_warning(trace)]:
        print(f"warning: {line}", file=sys.stderr)
    for path, checked in tables.items():
        _write_device_table(checked, path, list(table), trace.n_devices)
    return 0


def _repetition_warning(trace: Trace) -> list[str]:
    """What repeating the records added, when over 10 % of the online time."""
    g = trace.generator
    if g.get("repeat", "none") == "none" or not g.get("recorded_online_s"):
        return []
    added = g["online_s"] / g["recorded_online_s"] - 1
    if added <= 0.1:
        return []
    return [f"--repeat {g['repeat']} added {100 * added:.1f} % to the recorded online time "
            f"({g['recorded_online_s'] / 3600:.1f} h recorded, {g['online_s'] / 3600:.1f} h in the trace); "
            f"{g['short_records']} of {trace.n_devices} devices' records cover less than half of the "
            f"horizon; --repeat none keeps only what was recorded"]


def device_table(trace: Trace, columns: dict) -> dict:
    """device_id, name (where the converter renumbered the devices), tz_offset (where known)
    and the source's per-device columns."""
    table = {"device_id": np.arange(trace.n_devices)}
    if trace.generator.get("ids") is not None:
        table["name"] = [str(name) for name in trace.generator["ids"]]
    if trace.generator.get("tz_offset_h") is not None:
        table["tz_offset"] = np.asarray(trace.generator["tz_offset_h"], dtype=np.float64)
    return {**table, **{k: v for k, v in columns.items() if k not in table}}


# -- helpers --------------------------------------------------------------------------------

def parse_value(text: str):
    """A TOML literal (0.3, 20, [1, 0.5], "sine", true; a date-time as its text), else the text
    as a string."""
    try:
        return toml_value(text)
    except tomllib.TOMLDecodeError:
        return text


def _one_line(trace: Trace) -> str:
    kind = trace.generator.get("kind", "trace")
    return (f"{kind}, {trace.n_devices} device{'s' * (trace.n_devices != 1)}, {trace.n_intervals} "
            f"interval{'s' * (trace.n_intervals != 1)}, horizon "
            f"{human_duration(trace.horizon)}, mean availability {trace.availability().mean():.3f}")


def format_summary(name, s: dict) -> str:
    """The text table of ``trace info``."""
    a, sess, gap = s["availability"], s["session_s"], s["gap_s"]
    lines = [
        f"trace      {name}",
        f"generator  {s['generator'] or '-'}",
        f"devices    {s['devices']}  ({s['never_online']} never online)",
        f"intervals  {s['intervals']}",
        f"horizon    {human_duration(s['horizon_s'])}  ({s['horizon_s']:g} s), wrap {s['wrap']}",
        f"origin     {s['origin'] or '-'}",
        "",
        f"{'':16}{'mean':>10}{'min':>10}{'q10':>10}{'median':>10}{'q90':>10}{'max':>10}",
        _row("availability", a, "{:.3f}".format) + f"   std {_num(a['std'], '{:.3f}')}",
        _row("session", sess, human_duration),
        _row("gap", gap, human_duration),
        "",
        f"hourly profile (fraction online by hour of day, {s['hourly_clock']})",
    ]
    profile = s["hourly_profile"]
    peak = max((v for v in profile if v is not None), default=0.0) or 1.0
    for hour, value in enumerate(profile):
        bar = "" if value is None else "#" * round(30 * value / peak)
        lines.append(f"  {hour:02d}h {_num(value, '{:.3f}'):>6} {bar}")
    rep = s.get("repetition")
    if rep and rep.get("repeat", "none") != "none" and rep.get("online_s"):
        repeated = 1 - rep["recorded_online_s"] / rep["online_s"]
        lines += ["", f"repetition: {100 * repeated:.1f} % of the online time is repeated from the record "
                      f"(--repeat {rep['repeat']}; {rep['short_records']} devices' records cover less than "
                      "half of the horizon)"]
    if s.get("by_zone"):
        zone = s["by_zone"]
        clock = f"({s['hourly_clock']})"
        lines += ["", f"availability by {'time zone' if zone['column'] == 'tz_offset' else 'group'} "
                      f"(from {zone['source']})",
                  f"{'':16}{'devices':>8}{'mean':>10}{'q10':>10}{'median':>10}{'q90':>10}   most online at"]
        for r in zone["rows"]:
            label = f"UTC{r['zone']:+g}" if zone["column"] == "tz_offset" else f"group {r['zone']:g}"
            lines.append(f"{label:16}{r['devices']:>8}" + "".join(f"{r[k]:>10.3f}" for k in ("mean", "q10", "median", "q90"))
                         + f"   {r['peak_hour']:02d}h {clock}")
    return "\n".join(lines)


def _row(label: str, stats: dict, show) -> str:
    cells = [stats["mean"], stats["q0"], stats["q10"], stats["q50"], stats["q90"], stats["q100"]]
    return f"{label:16}" + "".join(f"{'-' if v is None else show(v):>10}" for v in cells)


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
