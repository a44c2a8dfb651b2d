#!/usr/bin/env python3
"""Markdown table of a `python -m flash3.bench --json` file, for docs/performance.md.

    python tools/bench_table.py bench_bwd.json [--previous older.json]

With --previous, a column gives flash3's ratio to the same shape in the older run.
"""
import argparse
import json


def rows(path):
    with open(path) as f:
        data = json.load(f)
    return data["environment"], data["results"]


def key(r):
    return (r["head_dim"], r["causal"], r["seqlen"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json")
    parser.add_argument("--previous", default=None)
    args = parser.parse_args()
    env, results = rows(args.json)
    before = {key(r): r for r in rows(args.previous)[1]} if args.previous else {}
    print(f"{env.get('pass', 'forward')}, {env['dtype']}, {env['device']}, torch {env['torch']}, "
          f"cuDNN {env['cudnn']}, sha {str(env.get('git_sha'))[:7]}")
    print()
    # The forward also times SDPA's math backend (eager PyTorch attention).
    has_math = any(r["tflops"].get("math") for r in results)
    header = "| d | causal | s | flash3 | cuDNN | FA2 |" + (" math |" if has_math else "")
    header += " flash3/cuDNN | flash3/FA2 |" + (" flash3/math |" if has_math else "")
    if before:
        header += " vs previous |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for r in results:
        t = r["tflops"]
        f3 = t.get("flash3")
        others = [t.get(name) for name in ("cudnn", "fa2") + (("math",) if has_math else ())]
        cells = [str(r["head_dim"]), "yes" if r["causal"] else "no", str(r["seqlen"])]
        cells += [f"{v:.0f}" if v else "n/a" for v in [f3] + others]
        cells += [f"{f3 / v:.2f}x" if f3 and v else "n/a" for v in others]
        if before:
            old = before.get(key(r), {}).get("tflops", {}).get("flash3")
            cells.append(f"{f3 / old:.2f}x" if f3 and old else "n/a")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
