"""Bytes per invitation of events.parquet: as written now (zstd, sorted rows, delta-encoded
device ids, byte-stream-split times, dictionaries), as earlier releases wrote the same rows
(Parquet's defaults: snappy, dictionaries), and with `[run] events = "failures"`.

Three runs of the quadratic task through `fedsim run` (the events log does not depend on
the model): Wang & Ji's periodic availability with every online device invited (ideal
timing), Bernoulli p = 0.5 with 10 % of the devices invited at random (ideal timing), and
lognormal devices under model timing with a deadline and over-commitment.

    python benchmarks/bench_events_log.py                 # 2,000 devices x 300 rounds
    python benchmarks/bench_events_log.py --quick         # 300 devices x 60 rounds
    python benchmarks/bench_events_log.py --out benchmarks/results_events_log.json
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from bench_trace_bits import report  # noqa: E402

SCENARIOS = {
    "ideal, periodic, every online device": {
        "server": {"timing": "ideal", "round_duration": 1.0, "clients_per_round": 0},
        "trace": {"source": "periodic", "groups": 5, "rounds_per_group": 20}},
    "ideal, bernoulli 0.5, 10 % invited": {
        "server": {"timing": "ideal", "round_duration": 1.0, "clients_per_round": -10},  # -10: a tenth
        "trace": {"source": "bernoulli", "p": 0.5}},
    "model timing, lognormal, deadline": {
        "server": {"timing": "model", "round_duration": 1.0, "deadline": 3.0, "clients_per_round": -10,
                   "overcommit": 0.3},
        "devices": {"model": "lognormal", "seconds_per_sample": 1.0, "compute_sigma": 0.5,
                    "bandwidth_bps": 2e6, "latency_s": 0.05},
        "trace": {"source": "bernoulli", "p": 0.5}},
}


def config(name: str, devices: int, rounds: int, out: Path, kept: str) -> dict:
    body = {
        "run": {"rounds": rounds, "eval_every": rounds, "out": str(out), "name": name, "progress": False,
                "plots": False, "events": kept},
        "data": {"dataset": "quadratic", "clients": devices, "dim": 4},
        "client": {"batch_size": 0, "local_steps": 1, "lr": 0.1},
        "algorithm": {"name": "mifa"},
    }
    for section, keys in SCENARIOS[name].items():
        body[section] = dict(keys)
    if body["server"]["clients_per_round"] < 0:
        body["server"]["clients_per_round"] = devices // -body["server"]["clients_per_round"]
    return body


def earlier_bytes(path: Path) -> int:
    """The same rows as earlier releases wrote them: Parquet's defaults, row groups of 65,536."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pq.read_table(path), buffer, row_group_size=1 << 16)
    return len(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args()
    from fedsim.cli import main as fedsim
    from fedsim.config import dump_toml

    devices, rounds = (300, 60) if args.quick else (2000, 300)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in SCENARIOS:
            found = {}
            for kept in ("all", "failures"):
                out = Path(tmp) / kept
                path = Path(tmp) / f"{kept}.toml"
                path.write_text(dump_toml(config(name, devices, rounds, out, kept)))
                assert fedsim(["run", str(path), "--quiet"]) == 0
                found[kept] = out / name / "events.parquet"
            import pyarrow.parquet as pq

            invitations = pq.ParquetFile(found["all"]).metadata.num_rows
            kept_rows = pq.ParquetFile(found["failures"]).metadata.num_rows
            now, before = found["all"].stat().st_size, earlier_bytes(found["all"])
            rows.append({"scenario": name, "devices": devices, "rounds": rounds, "invitations": invitations,
                         "bytes_per_row_before": round(before / invitations, 2),
                         "bytes_per_row_now": round(now / invitations, 2),
                         "failures_rows": kept_rows,
                         "failures_bytes_per_invitation": round(found["failures"].stat().st_size / invitations, 2)})
            print(rows[-1], flush=True)
    report(rows, args.out)


if __name__ == "__main__":
    main()
