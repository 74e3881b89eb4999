"""The app's use cases without UI: `Studio` (facade.py) holds the runtime that owns the model lock and the executors, and one small service per concern (builds, histories, clusters, jobs, decode, votes, campaigns,
explore, own_data, population_jobs), which the tabs call directly, and decoder (where decodes run).

May import: personalize.distributed, personalize.humaneval, personalize.fitting and everything below them. Not eval, ui or cli.
"""
