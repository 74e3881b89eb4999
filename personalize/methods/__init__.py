"""Every method in one shape (base.Method), CARD's own three included, reached by name through one registry.

- base.py: the `Method` protocol, `UserContext` (one person as the methods see them) and the helpers they share;
- registry.py: name -> class for every method of catalog.py, and `get_method`;
- card/: CARD whole: its config, clusters, adapters, head, style, decoding, method (base, cluster, card and its
  variants), the steering of its rows, the score of a text;
- rag.py, pag.py, exact.py, cope.py, oppu.py, p2p/: the compared methods (docs/METHOD.md §2-§5), each with a frozen
  `XConfig` and an `XMethod(engine, store=None, cfg=XConfig())`; a method that steers its rows in a mixed batch
  (cope, p2p, card) implements serving.rows.Steer beside it, so the runner knows none of them;
- engine.py: the loaded build (LM, cluster adapters, heads, encoder) the methods decode with.
- artifacts.py: a build's config.json read without the model code (the CLI refuses a missing build at once).

What a method chose for an output (retrieved items, attributes) is in `Generation.trace`.

May import: personalize.serving, personalize.lm and the shared top-level modules.
"""
