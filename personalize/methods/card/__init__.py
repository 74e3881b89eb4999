"""CARD in one folder (docs/METHOD.md §1), as peft keeps a tuner: the build's settings (config), user clusters
(cluster), cluster LoRAs (adapters), the personalization head (head), a person's style and the one scoring rule
(style), reward-guided decoding as a LogitsProcessor (decoding), the method class (method), its decoding as rows or
alone (card_decode), the steering of its rows in a mixed batch (steer: the Steer of serving.rows), the teacher-forced
score of a text under a row (score), the neutral rewrites of free-form items (neutral) and the style key's format
(stylekey). The fit that ties them to a loaded build is methods/engine.py.

May import: what personalize.methods may import.
"""
