"""Benchmark: ``gnll serve`` under concurrent clients (dynamic batching) and the proxy's overhead.

Arms, on the same TriviaQA short prompts that ``gnll eval`` builds (5-shot, greedy, 50 tokens):

- ``c1``: one client sending the prompts one at a time (the server without batching to exploit);
- ``c4``, ``c16``, ``c64``: N concurrent clients on loopback, each taking the next prompt;
- ``eval``: ``gnll eval --tasks triviaqa_short --measures g-nll`` on the same prompts, generation
  time only (its ``timings.json``), i.e. the library's own batched questions/second;
- ``eval16``: the same with ``--batch_size 16``: the library with every prompt queued up front but
  only 16 rows decoding at a time, as many as 16 clients can keep in flight (the best a server can do
  with 16 clients: how far the 0.8x target is from reach on this machine);
- ``direct`` vs ``proxy``: one request at a time, alternating, to the server and to a
  ``gnll serve --upstream`` proxy in front of it: the proxy's latency overhead at p50.

The server and the proxy are ``gnll serve`` child processes as users start them; the load comes
from this process (``httpx`` on asyncio). Arms are interleaved (order reversed every other
repetition) so they share the background load; the figures are medians over repetitions and
ratios within one run. Targets: at 16 clients >= 4x the one-at-a-time throughput and >= 0.8x
``gnll eval``'s questions/second; proxy overhead <= 5% at p50. The server's answers are checked
against ``gnll eval``'s (same text, G-NLL within 1e-3). Traffic is bounded (a fixed number of
requests) and goes to 127.0.0.1 only.

Usage::

    python bench/serve_load.py --output bench/results/serve_load.json
    python bench/serve_load.py --quick --output /tmp/serve_load.json
"""

from __future__ import annotations

import asyncio
import copy
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import httpx

STOP = ["\n", "Question:", "Context:"]


def start_server(args: list[str], port: int, log: Path, wait: float = 300) -> subprocess.Popen:
    cmd = [*common.gnll_cli(), "serve", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + wait
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"gnll serve did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)


def body(prompt: str) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 50,
        "stop": STOP,
    }


async def one(client: httpx.AsyncClient, url: str, prompt: str) -> tuple[float, dict]:
    t = time.perf_counter()
    r = await client.post(url + "/v1/chat/completions", json=body(prompt))
    r.raise_for_status()
    return time.perf_counter() - t, r.json()["choices"][0]


async def clients(url: str, prompts: list[str], n: int) -> dict[str, Any]:
    """``n`` concurrent clients share the prompt list; each sends its next prompt when answered."""
    queue = list(enumerate(prompts))[::-1]
    latencies: list[float] = []
    answers: dict[int, dict] = {}

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            i, p = queue.pop()
            dt, choice = await one(client, url, p)
            latencies.append(dt)
            answers[i] = choice

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(n)))
        wall = time.perf_counter() - t
    return {
        "wall_s": wall,
        "latencies": latencies,
        "answers": [answers[i] for i in range(len(prompts))],
    }


async def paired(direct: str, proxy: str, prompts: list[str]) -> dict[str, list[float]]:
    """Alternate direct and proxied requests (order swapped every other prompt)."""
    out: dict[str, list[float]] = {"direct": [], "proxy": []}
    async with httpx.AsyncClient(timeout=600) as client:
        for i, p in enumerate(prompts):
            order = [("direct", direct), ("proxy", proxy)]
            for name, url in order if i % 2 == 0 else order[::-1]:
                dt, _ = await one(client, url, p)
                out[name].append(dt)
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="prompts per arm (default 64; quick 2)")
    ap.add_argument(
        "--pairs", type=int, default=None, help="direct/proxy pairs per repetition (default 24)"
    )
    ap.add_argument("--repeats", type=int, default=None, help="default 3; quick 1")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    args = ap.parse_args()
    n = args.n or (2 if args.quick else 64)
    pairs = args.pairs or (2 if args.quick else 24)
    repeats = args.repeats or (1 if args.quick else 3)
    levels = [1, 2] if args.quick else [1, 4, 16, 64]
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the servers inherit it
    info = common.machine()
    prompts = common.triviaqa_prompts(n)
    import throughput  # bench/throughput.py: how `gnll eval` is run and timed

    runs: dict[str, list[dict[str, Any]]] = {f"c{c}": [] for c in levels}
    runs["eval"] = []
    runs["eval16"] = []
    proxy_lat: dict[str, list[float]] = {"direct": [], "proxy": []}
    with tempfile.TemporaryDirectory(prefix="gnll-serve-load-") as tmp:
        from gnll.serving.server import free_port

        port, pport = free_port(), free_port()
        url, purl = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{pport}"
        server = start_server(
            ["--model", args.model, "--max_batch_prompts", "64"], port, Path(tmp) / "server.log"
        )
        proxy = None
        try:
            proxy = start_server(["--upstream", url + "/v1"], pport, Path(tmp) / "proxy.log")
            asyncio.run(clients(url, prompts[: min(4, n)], min(4, n)))  # warm-up
            arms = [*runs]
            for rep in range(repeats):
                for arm in arms if rep % 2 == 0 else arms[::-1]:
                    if arm.startswith("eval"):
                        wd = Path(tmp) / f"{arm}-{rep}"
                        wd.mkdir()
                        width = ["--batch_size", "16"] if arm == "eval16" else []
                        res = throughput.run_eval(n, args.model, wd, ["--no-plots", *width])
                        runs[arm].append({"wall_s": res["gen_s"], "records": res["records"]})
                    else:
                        runs[arm].append(asyncio.run(clients(url, prompts, int(arm[1:]))))
                    print(f"  {arm} rep {rep}: {runs[arm][-1]['wall_s']:.2f} s", flush=True)
                got = asyncio.run(paired(url, purl, prompts[:pairs]))
                for k in proxy_lat:
                    proxy_lat[k] += got[k]
                # Written after every repetition, so a run cut short still leaves its figures.
                report(args, info, n, levels, rep + 1, runs, proxy_lat)
        finally:
            for proc in (proxy, server):
                if proc is not None:
                    proc.terminate()
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()


def report(
    args: Any,
    info: dict[str, Any],
    n: int,
    levels: list[int],
    repeats: int,
    runs: dict[str, list[dict[str, Any]]],
    proxy_lat: dict[str, list[float]],
) -> None:
    """Summarise the repetitions done so far, print and write the JSON (after every repetition)."""
    runs = copy.deepcopy(runs)

    def qps(arm: str) -> float:
        return n / statistics.median(r["wall_s"] for r in runs[arm])

    rows = []
    for arm in runs:
        lat = [x for r in runs[arm] for x in r.get("latencies", [])]
        rows.append(
            {
                "arm": {
                    "eval": "gnll eval (generation)",
                    "eval16": "gnll eval, 16 rows at a time (generation)",
                }.get(arm, f"{arm[1:]} concurrent clients"),
                "requests": n,
                "wall s (median)": statistics.median(r["wall_s"] for r in runs[arm]),
                "requests/s": qps(arm),
                "x one-at-a-time": qps(arm) / qps("c1"),
                "p50 latency s": pct(lat, 0.5) if lat else float("nan"),
                "p99 latency s": pct(lat, 0.99) if lat else float("nan"),
            }
        )
    ref = "c16" if "c16" in runs else f"c{levels[-1]}"
    eval_records = runs["eval"][0]["records"]
    served = runs[ref][0]["answers"]
    same = [
        e["text"] == s["message"]["content"].strip()
        for e, s in zip(eval_records, served, strict=True)
    ]
    g_diff = [
        abs(e["g_nll"] - s["uncertainty"]["g_nll"])
        for e, s, ok in zip(eval_records, served, same, strict=True)
        if ok
    ]
    p50_direct, p50_proxy = pct(proxy_lat["direct"], 0.5), pct(proxy_lat["proxy"], 0.5)
    paired_ratio = [p / d for d, p in zip(proxy_lat["direct"], proxy_lat["proxy"], strict=True)]
    proxy_rows = [
        {
            "arm": name,
            "requests": len(v),
            "p50 latency s": pct(v, 0.5),
            "p99 latency s": pct(v, 0.99),
            "mean s": statistics.fmean(v),
        }
        for name, v in proxy_lat.items()
    ]
    for r in runs.values():
        for x in r:
            x.pop("answers", None)
            x.pop("records", None)
    summary = {
        "reference_arm": ref,
        "speedup_vs_one_at_a_time": qps(ref) / qps("c1"),
        "target_speedup": ">= 4x at 16 clients",
        "met_speedup": qps(ref) / qps("c1") >= 4,
        "ratio_to_eval": qps(ref) / qps("eval"),
        "target_eval": ">= 0.8x gnll eval's questions/s",
        "met_eval": qps(ref) / qps("eval") >= 0.8,
        "eval16_to_eval": qps("eval16") / qps("eval") if "eval16" in runs else None,
        "ratio_to_eval16": qps(ref) / qps("eval16") if "eval16" in runs else None,
        "proxy_overhead_p50": p50_proxy / p50_direct - 1,
        "proxy_overhead_paired_median": statistics.median(paired_ratio) - 1,
        "target_proxy": "<= 5% at p50",
        "met_proxy": p50_proxy / p50_direct - 1 <= 0.05,
        "agreement_with_eval": {
            "same_text": sum(same),
            "n": len(same),
            "max_abs_g_nll_diff": max(g_diff, default=0.0),
        },
    }
    print(common.table(rows))
    print(common.table(proxy_rows))
    print(
        f"\n{ref}: {summary['speedup_vs_one_at_a_time']:.2f}x one-at-a-time (target >= 4x), "
        f"{summary['ratio_to_eval']:.2f}x gnll eval (target >= 0.8x); proxy p50 overhead "
        f"{100 * summary['proxy_overhead_p50']:.1f}% (target <= 5%); answers equal to eval's "
        f"{sum(same)}/{len(same)}"
    )
    common.finish(
        "serve_load",
        args,
        {
            "n": n,
            "repeats": repeats,
            "levels": levels,
            "table": rows,
            "proxy": proxy_rows,
            "summary": summary,
            "runs": runs,
            "proxy_latencies": proxy_lat,
        },
        info,
    )


if __name__ == "__main__":
    main()
