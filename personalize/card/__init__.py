"""CARD's own pieces (docs/METHOD.md §1): user clusters, cluster LoRAs, the personalization head, a person's style and
the one scoring rule, reward-guided decoding, the build's settings (config), the neutral rewrites of free-form
items and the style key's format.

May import: personalize.serving (decoding's settings and plain generate), personalize.lm and the shared top-level
modules (data, metrics, display, catalog).
"""
