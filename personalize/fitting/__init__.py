"""Fitting: populations from where writing lives (population, changelogs) and the build's arguments the CLI and
the studio share (plan: the first start's demo). CARD's own offline stage (build, tune) and a person's fit live in
methods/card/.

May import: personalize.methods, personalize.serving, personalize.lm and the shared top-level
modules. Not humaneval, studio, eval, ui or cli.
"""
