"""Work spread over Ray, asked for by a flag and otherwise absent: Ray is imported only inside the functions that
use it, so a run without `--ray` / `--decode` neither imports it nor needs it installed.

pool (connect to a local or remote Ray, map shards as tasks with retries and one progress bar), serve (the Ray
Serve deployment that holds a loaded build and decodes rows with the in-process scheduler), remote (the studio's
client of that deployment: the same submit/run seam as serving.scheduler.DecodeScheduler).

May import: personalize.humaneval, personalize.fitting and everything below them. Imported by studio (the remote
decoder) and eval (evaluation in shards).
"""
