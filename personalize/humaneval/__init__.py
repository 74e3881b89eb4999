"""Human evaluation: blind pairs (arena), campaigns (campaign: items, units, judgments; campaign_schema: its data
and tables, made by the store's migration step; campaign_pool: the output pool; campaign_report: results),
agreement statistics, an LM judge, the leaderboard, votes on copies of a person's past text (copies) and exports.

May import: personalize.methods, personalize.serving, personalize.lm and the shared top-level
modules. Not fitting, studio, eval, ui or cli.
"""
