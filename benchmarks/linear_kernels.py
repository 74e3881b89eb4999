"""torch's F.linear (MKL's sgemm on the CPU) against oneDNN's linear with packed weights (personalize/lm/onednn.py)
on SmolLM2-135M's shapes: the 30 decoder blocks' seven linears and the 49k × 576 head, at a decoding step's
few rows up to a prefill's hundreds.

    .venv/bin/python benchmarks/linear_kernels.py [--repeats 5] [--rows 1,2,6,16,32,48,96,256]

Random fp32 weights, one set per block, so each pass reads them from memory as a decode does; both kernels
alternate in one process, medians printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

BLOCK = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]  # (in, out)
LAYERS, VOCAB = 30, 49152


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="1,2,6,16,32,48,96,256")
    a = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    weights = [[torch.randn(o, i) for i, o in BLOCK] for _ in range(LAYERS)] + [[torch.randn(VOCAB, 576)]]
    packed = [[torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws] for ws in weights]

    def one_pass(rows: int, kernel: str) -> tuple[float, float]:
        x = {n: torch.randn(rows, n) for n in (576, 1536)}
        spent = []
        for part in (range(LAYERS), [LAYERS]):  # the blocks, then the head
            t0 = time.perf_counter()
            for b in part:
                for w, p in zip(weights[b], packed[b]):
                    if kernel == "mkl":
                        F.linear(x[w.shape[1]], w)
                    else:
                        torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], p, None, "none", [None], "")
            spent.append(time.perf_counter() - t0)
        return spent[0], spent[1]

    sizes = [int(r) for r in a.rows.split(",")]
    for rows in sizes:  # warm-up: oneDNN builds a primitive per shape on first use
        one_pass(rows, "onednn")
    got = {}
    for _ in range(a.repeats):
        for rows in sizes:
            for kernel in ("mkl", "onednn"):
                got.setdefault((rows, kernel), []).append(one_pass(rows, kernel))
    print(f"{'rows':>5}  {'blocks MKL':>11}  {'blocks oneDNN':>13}  {'head MKL':>9}  {'head oneDNN':>11}  (ms, medians)")
    for rows in sizes:
        med = {k: [statistics.median(v[j] for v in got[(rows, k)]) * 1e3 for j in (0, 1)] for k in ("mkl", "onednn")}
        print(f"{rows:>5}  {med['mkl'][0]:>11.1f}  {med['onednn'][0]:>13.1f}  {med['mkl'][1]:>9.1f}  {med['onednn'][1]:>11.1f}")


if __name__ == "__main__":
    main()
