"""Fitting: the offline build of a population's artifacts (build, plan: the build's arguments the CLI and the
studio share), the decoding choice and harm guard on validation people (tune), populations from where writing
lives (population), one person fitted from the store (person), votes as more of a person's text (votes).

May import: personalize.methods, personalize.serving, personalize.lm and the shared top-level
modules. Not humaneval, studio, eval, ui or cli.
"""
