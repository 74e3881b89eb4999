"""Whether a change moved any output: two demo people saved, fitted and compared (base, cluster, card, rag, cope;
greedy, the build's settings) on one prompt through the studio's use cases, and Why's CARD text, written as JSON.
Run it in a worktree of each commit and compare the files.

    python benchmarks/same_outputs.py OUT.json [--artifacts data/artifacts/demo] [--demo-data data/demo]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the tree it runs in (a worktree of the commit under test)

from personalize.studio.facade import Studio, StudioConfig  # noqa: E402

METHODS = ["base", "cluster", "card", "rag", "cope"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--artifacts", default="data/artifacts/demo")
    p.add_argument("--demo-data", default="data/demo")
    p.add_argument("--prompt", default="Fix the build with the new compiler")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp())
    st = Studio.load(StudioConfig(artifacts=a.artifacts, db=str(tmp / "studio.db"), demo_data=a.demo_data,
                                  first_use_in_background=False))
    out = {}
    for name in sorted(st.runtime.demo_users)[:2]:
        st.histories.save_history(name, st.histories.demo_items(name), st.runtime.task.name)
        st.fits.fit(name)
        s, prompt = st.runtime.settings(), st.runtime.task.prompt(a.prompt)
        out[name] = {o.method: o.text for o in st.comparisons.compare(name, prompt, METHODS, s)}
        why = st.comparisons.why(name, prompt, s)
        out[name]["why"] = why.text if hasattr(why, "text") else why["text"]  # a dict before Explanation
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
