"""The app's use cases without UI: `Studio` (facade.py) holds the runtime that owns the model lock and the executors, and one small service per concern, its module, class and attribute named alike (builds, histories, clusters,
first_use_jobs, comparisons, fits, voting, campaign_desk, explorer, own_data, population_jobs), which the tabs call
directly, scheduling (where decodes run: in-process or on Ray Serve) and coming (the parts of the served build still
being built, during a first start).

May import: personalize.distributed, personalize.humaneval, personalize.fitting and everything below them. Not eval, ui or cli.
"""
