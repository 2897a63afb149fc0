#!/usr/bin/env python3
"""W1 to W4 of `baton bench` in LangGraph, in process and without durability (no checkpointer),
for BENCHMARKS.md's side-by-side figures: what an engine that keeps nothing, hands nothing to
another process and runs in one Python thread pays for the same shapes.

Each node is an agent that does nothing, as the bench's: it returns {"ok": true, "i": n} (W4:
with a 64 KiB string), stored under its step id in the state's `context`, which every node
receives whole, as the spec's default injection hands each agent every earlier result.

    python3 -m venv /tmp/lg && /tmp/lg/bin/pip install 'langgraph==1.2.*'
    /tmp/lg/bin/python scripts/compare/langgraph_workloads.py --reps 5

Prints one JSON line per workload: median_s, min_s, max_s and each repetition, as the bench.
"""

import argparse
import asyncio
import itertools
import json
import operator
import statistics
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

COUNTER = itertools.count()


def merge(left: dict, right: dict) -> dict:
    """The context grows by each node's result; branches of a fan-out merge theirs."""
    return {**left, **right}


class State(TypedDict):
    input: str
    context: Annotated[dict, merge]


def agent(step_id: str, blob: int = 0):
    def run(state: State) -> dict:
        result = {"ok": True, "i": next(COUNTER)}
        if blob:
            # Takes its payload whole, as blob64k does, then adds its own blob.
            assert state["context"] is not None
            result["blob"] = "x" * blob
        return {"context": {step_id: result}}

    return run


def chain(steps: int, blob: int = 0):
    graph = StateGraph(State)
    names = [f"s{i}" for i in range(steps)]
    for name in names:
        graph.add_node(name, agent(name, blob))
    graph.add_edge(START, names[0])
    for a, b in zip(names, names[1:]):
        graph.add_edge(a, b)
    graph.add_edge(names[-1], END)
    return graph.compile()


def fan_out(branches: int):
    graph = StateGraph(State)
    names = [f"b{i}" for i in range(branches)]
    graph.add_node("start", lambda state: {"context": {}})
    for name in names:
        graph.add_node(name, agent(name))
        graph.add_edge("start", name)
    graph.add_node("merge", agent("merge"))
    # The merge waits for every branch.
    graph.add_edge(names, "merge")
    graph.add_edge(START, "start")
    graph.add_edge("merge", END)
    return graph.compile()


def timed(run, reps: int):
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def line(workload: str, steps: int, times: list) -> dict:
    median = statistics.median(times)
    return {
        "workload": workload,
        "engine": "langgraph",
        "steps": steps,
        "median_s": round(median, 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "steps_per_s": round(steps / median, 1),
        "reps_s": [round(t, 4) for t in times],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    args = parser.parse_args()
    wanted = args.workloads.split(",")
    config = {"recursion_limit": 10_000}
    start = {"input": "bench", "context": {}}

    if "W1" in wanted:
        graph = chain(200)
        graph.invoke(start, config)  # warm-up, as the bench's
        print(json.dumps(line("W1", 200, timed(lambda: graph.invoke(start, config), args.reps))))
    if "W2" in wanted:
        graph = fan_out(500)
        graph.invoke(start, config)
        print(json.dumps(line("W2", 501, timed(lambda: graph.invoke(start, config), args.reps))))
    if "W3" in wanted:
        graph = chain(3)

        async def runs():
            await asyncio.gather(*(graph.ainvoke(start, config) for _ in range(200)))

        asyncio.run(runs())
        print(json.dumps(line("W3", 600, timed(lambda: asyncio.run(runs()), args.reps))))
    if "W4" in wanted:
        graph = chain(200, blob=64 * 1024)
        graph.invoke(start, config)
        print(json.dumps(line("W4", 200, timed(lambda: graph.invoke(start, config), args.reps))))


if __name__ == "__main__":
    main()
