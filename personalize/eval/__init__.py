"""Evaluation and benchmarks, outside the runtime import graph: ROUGE per method and the efficiency tables
(evaluate; in shards on Ray: ray_eval), the serving benchmark over a Studio (bench_serving), and the CLI's eval/bench/tune commands (commands).

May import: personalize.studio and everything below it. Nothing of the app or the library imports this package.
"""
