"""Two models on one device (issue 11): ``python -m bench.models``.

One server, one device thread, a repository of two models: ``mlp`` (the heavy one, ~19 M
parameters) and ``linear`` (the light one). In one run it measures, with wrk on loopback:
- each model alone (the other loaded and idle) and both driven at once: items/s and p99;
- the light model at concurrency 1, alone and while the heavy one is saturated (c=64): its
  p50 and p99 against the heavy model's batch time.
Everything comes from one server process, so the ratios compare like with like.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.run import HERE, answered_s, instance_for, run_wrk, scrape, server_process

MODELS = ("mlp", "linear")


def repository(root: Path, max_batch: int) -> Path:
    for name in MODELS:
        (root / name).mkdir(parents=True)
        (root / name / "config.toml").write_text(
            f'model = "{name}"\nmax_batch_size = {max_batch}\n')
    return root


def bodies(root: Path) -> dict[str, str]:
    out = {}
    for name in MODELS:
        path = root / f"{name}.json"
        path.write_text(json.dumps({"instances": [instance_for(name, 0)]}))
        out[name] = str(path)
    return out


def drive(url: str, body: dict[str, str], loads: dict[str, int], seconds: float
          ) -> dict[str, dict[str, Any]]:
    """wrk on each model of ``loads`` (name -> concurrency) at the same time."""
    results: dict[str, dict[str, Any]] = {}

    def one(name: str, c: int) -> None:
        results[name] = run_wrk(url, body[name], c, seconds, f"/models/{name}/predict")

    threads = [threading.Thread(target=one, args=item) for item in loads.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def row(label: str, name: str, r: dict[str, Any]) -> dict[str, Any]:
    return {"run": label, "model": name, "items_s": answered_s(r),
            "p50_ms": r["p50_us"] / 1000, "p99_ms": r["p99_us"] / 1000,
            "errors": r["http_errors"] + r["socket_errors"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="per measured run")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "models.json")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        body = bodies(root)
        flags = ["--model-repository", str(repository(root / "repo", args.max_batch_size)),
                 "--devices", "cpu", "--torch-threads", "1", "--queue-capacity", "4096"]
        with server_process(flags) as (url, pid):
            # The server on core 0, wrk on core 1 (this box has two).
            subprocess.run(["taskset", "-pc", "0", str(pid)], capture_output=True, check=False)
            drive(url, body, {"mlp": 64, "linear": 64}, 2.0)  # warm both paths up
            for name in MODELS:
                rows.append(row("alone c=64", name, drive(url, body, {name: 64},
                                                           args.seconds)[name]))
            for name, r in drive(url, body, {"mlp": 64, "linear": 64}, args.seconds).items():
                rows.append(row("together c=64 each", name, r))
            rows.append(row("light alone c=1", "linear",
                            drive(url, body, {"linear": 1}, args.seconds)["linear"]))
            busy = drive(url, body, {"mlp": 64, "linear": 1}, args.seconds)
            rows.append(row("light c=1, heavy c=64", "linear", busy["linear"]))
            rows.append(row("light c=1, heavy c=64", "mlp", busy["mlp"]))
            seconds, batches = scrape(url, "batchserve_batch_compute_seconds_sum",
                                      "batchserve_batch_compute_seconds_count", model="mlp")
            mlp_batch_ms = 1000 * seconds / max(1.0, batches)
    print(f"{'run':<24} {'model':<7} {'items/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for r in rows:
        print(f"{r['run']:<24} {r['model']:<7} {r['items_s']:>9.0f} {r['p50_ms']:>8.2f} "
              f"{r['p99_ms']:>8.2f} {r['errors']:>6}")
    by = {(r["run"], r["model"]): r for r in rows}
    for name in MODELS:
        alone, both = by[("alone c=64", name)], by[("together c=64 each", name)]
        print(f"{name}: together / alone items/s {both['items_s'] / alone['items_s']:.2f}, "
              f"p99 {both['p99_ms'] / alone['p99_ms']:.2f} x")
    light, loaded = by[("light alone c=1", "linear")], by[("light c=1, heavy c=64", "linear")]
    print(f"linear c=1 next to a saturated mlp: p50 {loaded['p50_ms']:.2f} ms "
          f"(alone {light['p50_ms']:.2f}), p99 {loaded['p99_ms']:.2f} ms "
          f"(alone {light['p99_ms']:.2f}); mean mlp batch {mlp_batch_ms:.1f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "mlp_batch_ms": mlp_batch_ms,
                                    "at": time.strftime("%Y-%m-%d %H:%M")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
