"""The proxy's overhead in front of a real vLLM server: the same chat requests sent straight to vLLM
and through ``gnll serve --upstream`` (in this process), at 1 and 16 concurrent clients.

The arms are interleaved (direct, proxy, proxy, direct, ...) so both see the same background load; a
repetition sends ``--requests`` greedy chat requests (TriviaQA questions, ``max_tokens`` 16) with
``--concurrency`` clients. The table shows each arm's median seconds and the median paired ratio
proxy / direct. vLLM is the CPU build (``scripts/vllm_venv.sh``); ``--base_url`` points at a running
server, otherwise one is started on the embedded SmolLM2 (``gnll.backends.openai.launch.VllmServer``)
from ``--vllm_python``.

Usage::

    python bench/vllm_proxy.py --output bench/results/vllm_proxy.json
    python bench/vllm_proxy.py --base_url http://127.0.0.1:8000/v1 --quick
"""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common
import httpx

MODEL = "smollm2-135m-instruct"


def send_all(url: str, questions: list[str], concurrency: int) -> None:
    def one(q: str) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 16,
                "temperature": 0, "logprobs": True}  # fmt: skip
        r = httpx.post(url + "/chat/completions", json=body, timeout=600)
        r.raise_for_status()

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, questions))


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--base_url", default=None, help="a running vLLM server's /v1 URL")
    ap.add_argument("--vllm_python", default=str(Path.home() / ".cache/gnll-venvs/vllm/bin/python"))
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.quick:
        args.requests, args.repeats = 16, 2
    from gnll.serving import ServeSettings, build_proxy_app
    from gnll.serving.server import ServerThread

    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            from gnll.backends.embedded import embedded_model_dir
            from gnll.backends.openai.launch import VllmServer
            from gnll.backends.registry import EMBEDDED_MODELS

            path = embedded_model_dir(EMBEDDED_MODELS[MODEL], progress=False)
            server = VllmServer(path, MODEL, python=args.vllm_python, lifetime=7200)
            base_url = stack.enter_context(server).base_url
        app = build_proxy_app(base_url, ServeSettings(upstream_timeout=600))
        proxy = stack.enter_context(ServerThread(app)).url + "/v1"
        questions = common.triviaqa_questions(args.requests)
        results: dict = {
            "benchmark": "vllm_proxy",
            "quick": args.quick,
            "machine": common.machine(),
            "requests": args.requests,
            "runs": {},
        }
        for concurrency in (1, 16):
            arms = {
                "direct": lambda c=concurrency: send_all(base_url, questions, c),
                "proxy": lambda c=concurrency: send_all(proxy, questions, c),
            }
            run = common.interleave(arms, args.repeats)
            ratio = common.paired_ratios(run["proxy"]["seconds"], run["direct"]["seconds"])
            results["runs"][concurrency] = {**run, "proxy_over_direct": ratio}
            print(
                f"concurrency {concurrency:2d}: direct {run['direct']['median_s']:.2f} s, "
                f"proxy {run['proxy']['median_s']:.2f} s for {args.requests} requests; "
                f"proxy/direct median paired ratio {ratio['median_paired_ratio']:.3f} "
                f"(min {ratio['min_paired_ratio']:.3f}, max {ratio['max_paired_ratio']:.3f})"
            )
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
