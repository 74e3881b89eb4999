"""Work spread over Ray, asked for by a flag and otherwise absent: Ray is imported only inside the functions that
use it, so a run without `--ray` / `--decode` neither imports it nor needs it installed.

pool (connect to a local or remote Ray, map shards as tasks with retries and one progress bar), workers (what a
worker process keeps between tasks: the build, the LM to train on), people (people onboarded and decoded in shards:
eval's and tune's), adapters (build's cluster adapters as tasks), requests (campaign generate's decodes in shards),
serve (the Ray Serve deployment that holds a loaded build and decodes rows with the in-process scheduler), remote
(the studio's client of that deployment: the same submit/run seam as serving.scheduler.DecodeScheduler).

May import: personalize.humaneval, personalize.fitting and everything below them. Imported by studio (the remote
decoder), eval (evaluation in shards) and the CLI (build, tune and campaign generate with --ray).
"""
