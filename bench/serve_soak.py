"""Soak: ``gnll serve`` under 16 concurrent clients for minutes, in-process and as a proxy.

Each client sends, back to back until the time is up, a rotation of the four request kinds an
OpenAI client sends: completions, chat, and both as streams (greedy, short answers). Every response
and every stream chunk is validated with the ``openai`` package's own types, and the run checks:

- **no errors**: every request answered 200 with one choice and a valid finish reason, every stream
  ended with exactly one finishing chunk per choice and ``[DONE]``;
- **nothing lost or duplicated**: every request (a client-side id in ``user``) got exactly one
  answer, the answers' ids are all different, and the server's access log holds exactly one
  generation entry per request sent (the proxy's and, behind it, the upstream's);
- **memory**: the resident set of each server process, sampled every 2 s; after a warm-up (the first
  quarter of the run) a least-squares line gives its growth in MB per minute and per 1,000 requests;
- **latency and throughput**: p50/p99 per request kind and overall, requests per second.

Modes: ``inprocess`` (one ``gnll serve --model M``) and ``proxy`` (``gnll serve --upstream`` in
front of such a server: the upstream carries the model, the proxy adds G-NLL). Servers are child
processes bound to 127.0.0.1; the load is bounded by time (``--minutes``) and by the number of
clients. Usage::

    OMP_NUM_THREADS=1 python bench/serve_soak.py --minutes 10 --output bench/results/serve_soak.json
    python bench/serve_soak.py --quick --output /tmp/serve_soak.json
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import common
import httpx
from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from serve_load import start_server

KINDS = ("completions", "chat", "chat-stream", "completions-stream")
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
WARMUP = 0.25  # share of the run left out of the memory fit


class StreamedChoice(CompletionChoice):
    """A completions stream chunk's choice: the SDK types such chunks as ``Completion``, whose
    ``finish_reason`` is required, while OpenAI's own streams send ``null`` until the last one."""

    finish_reason: Literal["stop", "length", "content_filter"] | None = None


class StreamedCompletion(Completion):
    choices: list[StreamedChoice]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def questions(n: int) -> list[str]:
    try:
        return common.triviaqa_questions(n)
    except Exception:  # noqa: BLE001 - no data directory: synthetic questions load a server as well
        return [f"What is {k} plus {k + 1}?" for k in range(n)]


def request_body(kind: str, question: str, rid: str, max_tokens: int) -> tuple[str, dict]:
    body: dict[str, Any] = {"temperature": 0, "max_tokens": max_tokens, "user": rid}
    if kind.startswith("chat"):
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": question}]
    else:
        path = "/v1/completions"
        body["prompt"] = f"Question: {question}\nAnswer:"
        body["stop"] = ["\n"]
    if kind.endswith("stream"):
        body["stream"] = True
    return path, body


async def one(client: httpx.AsyncClient, kind: str, question: str, rid: str, max_tokens: int):
    """One request; (answer id, latency in s) or raises with what was wrong."""
    path, body = request_body(kind, question, rid, max_tokens)
    start = time.perf_counter()
    if "stream" not in body:
        r = await client.post(path, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        kind_type = ChatCompletion if kind == "chat" else Completion
        answer = kind_type.model_validate(r.json())
        if len(answer.choices) != 1 or answer.choices[0].finish_reason is None:
            raise RuntimeError(f"bad choices: {r.text[:200]}")
        return answer.id, time.perf_counter() - start
    chunk_type = ChatCompletionChunk if kind == "chat-stream" else StreamedCompletion
    ids, finished, done = set(), 0, False
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                continue
            if done:
                raise RuntimeError("data after [DONE]")
            payload = json.loads(data)
            if "error" in payload:
                raise RuntimeError(f"error event: {payload['error']}")
            chunk = chunk_type.model_validate(payload)
            if chunk_type is StreamedCompletion and chunk.choices[0].finish_reason is not None:
                Completion.model_validate(payload)  # the last chunk is a whole Completion
            ids.add(chunk.id)
            finished += sum(c.finish_reason is not None for c in chunk.choices)
    if not done or finished != 1 or len(ids) != 1:
        raise RuntimeError(f"stream ended with done={done}, {finished} finishing chunks, ids {ids}")
    return ids.pop(), time.perf_counter() - start


async def client_loop(
    i: int, url: str, deadline: float, qs: list[str], max_tokens: int, out: list[dict]
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        n = 0
        while time.monotonic() < deadline:
            kind = KINDS[(i + n) % len(KINDS)]
            rid = f"client{i}-{n}"
            rec: dict[str, Any] = {"rid": rid, "kind": kind, "t": time.monotonic()}
            try:
                rec["id"], rec["latency"] = await one(
                    client, kind, qs[(7 * i + n) % len(qs)], rid, max_tokens
                )
            except Exception as exc:  # noqa: BLE001 - every failure is a finding, counted
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
            out.append(rec)
            n += 1


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def sample_memory(pids: dict[str, int], deadline: float, out: dict[str, list]) -> None:
    while time.monotonic() < deadline:
        now = time.monotonic()
        for name, pid in pids.items():
            value = rss_mb(pid)
            if value is not None:
                out.setdefault(name, []).append((now, value))
        await asyncio.sleep(2.0)


def growth(samples: list[tuple[float, float]], start: float, end: float) -> dict[str, float]:
    """RSS at warm-up's end and at the end, and the least-squares slope after warm-up (MB/min)."""
    cut = start + WARMUP * (end - start)
    late = [(t, v) for t, v in samples if t >= cut]
    if len(late) < 3:
        return {}
    ts = [t for t, _ in late]
    vs = [v for _, v in late]
    slope = statistics.linear_regression(ts, vs).slope * 60
    return {
        "rss_after_warmup_mb": round(vs[0], 1),
        "rss_end_mb": round(vs[-1], 1),
        "rss_max_mb": round(max(v for _, v in samples), 1),
        "slope_mb_per_min": round(slope, 3),
    }


def access_entries(log: Path) -> list[dict[str, Any]]:
    entries = []
    for line in log.read_text(errors="replace").splitlines():
        line = line[line.find("{") :] if "{" in line else ""
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        # the generation routes only: a proxy also asks its upstream for /v1/models
        if entry.get("event") == "request" and entry.get("path") in GENERATION_ROUTES:
            entries.append(entry)
    return entries


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def latency(records: list[dict]) -> dict[str, Any]:
    lat = [r["latency"] for r in records if "latency" in r]
    return {
        "n": len(lat),
        "p50_s": round(percentile(lat, 0.5) or 0, 3),
        "p99_s": round(percentile(lat, 0.99) or 0, 3),
    }


async def load(url: str, pids: dict[str, int], seconds: float, clients: int, max_tokens: int):
    qs = questions(200)
    records: list[dict] = []
    memory: dict[str, list] = {}
    start = time.monotonic()
    deadline = start + seconds
    await asyncio.gather(
        sample_memory(pids, deadline, memory),
        *(client_loop(i, url, deadline, qs, max_tokens, records) for i in range(clients)),
    )
    return records, memory, start, time.monotonic()


def run_mode(
    mode: str, model: str, seconds: float, clients: int, max_tokens: int, work: Path
) -> dict[str, Any]:
    """Start the server(s) of ``mode``, load them for ``seconds``, stop them, check everything."""
    up_port = free_port()
    procs: dict[str, Any] = {}
    logs = {"upstream": work / f"{mode}-upstream.log"}
    # a model's first load on a busy host can take minutes (conversion from GGUF included)
    procs["upstream"] = start_server(["--model", model], up_port, logs["upstream"], wait=1200)
    url = f"http://127.0.0.1:{up_port}"
    if mode == "proxy":
        port = free_port()
        logs["proxy"] = work / "proxy.log"
        procs["proxy"] = start_server(["--upstream", f"{url}/v1"], port, logs["proxy"], wait=600)
        url = f"http://127.0.0.1:{port}"
    try:
        pids = {name: p.pid for name, p in procs.items()}
        records, memory, start, end = asyncio.run(load(url, pids, seconds, clients, max_tokens))
        # A stream is logged when the server's side of it has ended, which may be a moment after
        # the client read [DONE]: give the last entries time to arrive before stopping.
        settle = time.monotonic() + 10
        while time.monotonic() < settle and any(
            len(access_entries(log)) < len(records) for log in logs.values()
        ):
            time.sleep(0.2)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except Exception:  # noqa: BLE001
                p.kill()
    errors = [r for r in records if "error" in r]
    ids = [r["id"] for r in records if "id" in r]
    rids = [r["rid"] for r in records]
    logged = {name: len(access_entries(log)) for name, log in logs.items()}
    wall = end - start
    ok = len(records) - len(errors)
    memory_growth = {name: growth(s, start, end) for name, s in memory.items()}
    per_1000 = {
        name: round(g["slope_mb_per_min"] / (ok / wall * 60) * 1000, 3)
        for name, g in memory_growth.items()
        if g and ok
    }
    return {
        "mode": mode,
        "seconds": round(wall, 1),
        "clients": clients,
        "requests": len(records),
        "errors": len(errors),
        "error_examples": sorted({e["error"] for e in errors})[:5],
        "duplicate_answer_ids": len(ids) - len(set(ids)),
        "duplicate_request_ids": len(rids) - len(set(rids)),
        "access_log_entries": logged,
        "lost": {name: len(records) - n for name, n in logged.items()},
        "throughput_rps": round(ok / wall, 3),
        "latency": {
            "all": latency(records),
            **{k: latency([r for r in records if r["kind"] == k]) for k in KINDS},
        },
        "memory": memory_growth,
        "memory_mb_per_1000_requests": per_1000,
    }


def passed(r: dict[str, Any]) -> bool:
    return (
        r["requests"] > 0
        and r["errors"] == 0
        and r["duplicate_answer_ids"] == 0
        and all(v == 0 for v in r["lost"].values())
    )


def main() -> None:
    ap = common.parser(__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="load time per mode")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--mode", choices=["inprocess", "proxy", "both"], default="both")
    ap.add_argument("--model", default=common.DEFAULT_MODEL, help="embedded name, hub id or path")
    ap.add_argument("--max_tokens", type=int, default=16)
    args = ap.parse_args()
    seconds = 20.0 if args.quick else 60 * args.minutes
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads or 1))
    modes = ["inprocess", "proxy"] if args.mode == "both" else [args.mode]
    info = common.machine()
    results: dict[str, Any] = {"model": args.model, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            r = run_mode(mode, args.model, seconds, args.clients, args.max_tokens, Path(tmp))
            r["passed"] = passed(r)
            results["modes"][mode] = r
            print(json.dumps(r, indent=1))
    common.finish("serve_soak", args, results, info)
    if not all(r["passed"] for r in results["modes"].values()):
        raise SystemExit("soak FAILED: see errors, duplicates and lost above")


if __name__ == "__main__":
    main()
